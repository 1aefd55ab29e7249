"""Building blocks of the decoder models (norms, rotary, fused linears, activations)."""
