"""Bytes one decode step must read, for the achieved-bandwidth figure of the benchmarks.

A decode step (every sequence of the batch appends one token) is memory-bound at small
batch: its time is bounded below by (bytes read) / (peak memory bandwidth). This module
counts those bytes the way gpt-fast's ``generate.py`` reports "achieved bandwidth":

- weights: every parameter a forward touches, once. Mixture-of-experts layers read only the
  experts their tokens chose: with E experts, top-k routing and a batch of B tokens, the
  expected number of distinct experts under uniform routing, ``E * (1 - (1 - k/E) ** B)``
  (exactly k at B = 1), times one expert's bytes (the active parameters).
  The embedding table is only gathered:
  ``batch * hidden * dtype_bytes`` are read from it, not the whole table. The lm_head is a
  full matmul: its whole ``vocab * hidden`` matrix is read, once, even when it is tied to
  the embedding (then the table counts as lm_head and its gathered rows are added).
- KV cache: each layer reads K and V of every cached token of every sequence:
  ``2 * layers * kv_heads * head_dim * dtype_bytes * context_len * batch``.

Activations, logits and the sampler are left out (small next to the weights at batch sizes
where the bound matters); so the ratio measured / floor is an upper bound on efficiency.
"""

from __future__ import annotations

from typing import Any


def model_weight_bytes(model: Any, hidden_size: int, vocab_size: int, batch: int) -> int:
    """Weight bytes read by one decode step of ``model`` (a torch ``nn.Module``).

    Args:
        model: the engine's model; parameters are de-duplicated by storage (a tied lm_head
            shares the embedding's), parameters named ``*embed_tokens*`` are not counted
            whole.
        hidden_size: width of the embedding rows.
        vocab_size: rows of the lm_head matrix.
        batch: sequences in the step (rows gathered from the embedding table).
    Returns:
        bytes = sum(other parameters) + vocab*hidden*b (lm_head) + batch*hidden*b (rows),
        with b the element size of the embedding / lm_head weight.
    """
    seen: set[int] = set()
    total = 0
    head_elem = None
    active = _active_expert_fraction(model, batch)
    for name, p in model.named_parameters(remove_duplicate=False):
        key = p.data_ptr()
        if name.endswith(("experts.w13_weight", "experts.w2_weight")) and key not in seen:
            seen.add(key)
            total += int(p.numel() * p.element_size() * active[name.rsplit(".", 1)[0]])
            continue
        if "embed_tokens" in name or name.startswith("lm_head"):
            head_elem = p.element_size()
            seen.add(key)
            continue
        if key in seen:
            continue
        seen.add(key)
        total += p.numel() * p.element_size()
    head_elem = head_elem or _first_elem_size(model)
    return total + vocab_size * hidden_size * head_elem + batch * hidden_size * head_elem


def _active_expert_fraction(model: Any, batch: int) -> dict[str, float]:
    """Per MoE experts module name: expected fraction of its experts a batch of ``batch``
    tokens reads, ``1 - (1 - k/E) ** batch`` (uniform routing)."""
    fractions = {}
    for name, module in model.named_modules():
        if hasattr(module, "num_experts") and hasattr(module, "top_k"):
            fractions[name] = 1.0 - (1.0 - module.top_k / module.num_experts) ** batch
    return fractions


def _first_elem_size(model: Any) -> int:
    return next(model.parameters()).element_size()


def config_weight_bytes(hf_config: Any, dtype_bytes: int, batch: int) -> int:
    """The same count from a Llama / Qwen2 config alone (no weights needed).

    Per layer: q/k/v/o projections (+ q/k/v biases for Qwen2), gate/up/down projections,
    two RMSNorm weights; plus the final norm, the full lm_head and ``batch`` embedding rows.
    """
    c = hf_config
    h, inter, n = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    heads = c.num_attention_heads
    kv = getattr(c, "num_key_value_heads", None) or heads
    d = getattr(c, "head_dim", None) or h // heads
    qkv_out = (heads + 2 * kv) * d
    qwen2 = getattr(c, "model_type", "") == "qwen2"
    qkv_bias = qwen2 or bool(getattr(c, "attention_bias", False))
    mlp_bias = bool(getattr(c, "mlp_bias", False)) and not qwen2
    o_bias = bool(getattr(c, "attention_bias", False)) and not qwen2
    per_layer = h * qkv_out + heads * d * h + 3 * h * inter + 2 * h
    per_layer += qkv_out * qkv_bias + h * o_bias + (2 * inter + h) * mlp_bias
    elems = n * per_layer + h + c.vocab_size * h + batch * h
    return elems * dtype_bytes


def kv_bytes_per_step(
    num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int, context: float, batch: int
) -> float:
    """KV-cache bytes read by one decode step: ``2 * layers * kv_heads * head_dim *
    dtype_bytes * context * batch`` (K and V; ``context`` = cached tokens per sequence)."""
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes * context * batch


def mean_decode_context(input_len: int, output_len: int) -> float:
    """Average tokens attended per decode step of a request generating ``output_len``
    tokens after an ``input_len`` prompt.

    Decode step i (1..output_len-1) feeds the i-th generated token, which attends to the
    prompt plus i tokens (itself included): the mean of ``input_len + i`` is
    ``input_len + output_len / 2``.
    """
    if output_len < 2:
        return float(input_len)
    return input_len + output_len / 2
