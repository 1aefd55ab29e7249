"""The attention layer used by every model: a thin module that delegates to the backend."""

from __future__ import annotations

import torch
from torch import nn

from vllm.attention.backends.abstract import AttentionMetadata, AttentionSpec


class Attention(nn.Module):
    """Multi-head attention with grouped KV heads over a paged KV cache.

    Args:
        num_heads: query heads.
        head_size: channels per head.
        scale: softmax scale (head_size ** -0.5 for Llama/Qwen2).
        num_kv_heads: key/value heads (num_heads must be a multiple of it).
        prefix: the module's name, for logs.
        sliding_window: when set, each query attends only to the ``sliding_window`` most
            recent positions, itself included (key position > query position - window, as
            transformers' sliding-window mask); None: the whole causal context.
        logits_soft_cap: when set, attention scores become ``cap * tanh(scores / cap)``
            before the softmax (Gemma); None: no capping.

    Raises:
        ValueError: num_heads not a multiple of num_kv_heads, a window below 1 or a cap
            that is not positive.

    The backend is known from the metadata (``attn_metadata.impl``), so models never
    branch on it and no global is consulted.

    KV-cache scales: buffers ``k_scale`` and ``v_scale`` ([] float32, 1.0 until a
    checkpoint's scales load through :meth:`set_kv_scale`) and their values as Python
    floats, ``k_scale_float`` / ``v_scale_float``, which the backends read: an 8-bit cache
    stores ``key / k_scale`` and attention reads ``stored * k_scale`` (values likewise;
    vllm/attention/kv_cache_dtype.py). They are buffers, not parameters: a checkpoint
    without them loads as before (every parameter must come from the checkpoint).
    """

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        prefix: str = "",
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
    ):
        super().__init__()
        if num_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}."
            )
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window={sliding_window} must be at least 1 (or None).")
        if logits_soft_cap is not None and not logits_soft_cap > 0:
            raise ValueError(f"logits_soft_cap={logits_soft_cap} must be positive (or None).")
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.prefix = prefix
        self.register_buffer("k_scale", torch.tensor(1.0, dtype=torch.float32))
        self.register_buffer("v_scale", torch.tensor(1.0, dtype=torch.float32))
        self.k_scale_float = 1.0
        self.v_scale_float = 1.0

    def set_kv_scale(self, which: str, value: torch.Tensor) -> None:
        """Set the key (``which="k"``) or value (``"v"``) scale of the KV cache from a
        checkpoint tensor ``value`` holding one positive finite number (shape [] or [1],
        any float dtype; rounded to float32 as upstream keeps it).

        Raises:
            ValueError: ``which`` not "k" or "v", or ``value`` not a single positive
                finite number (per-head or per-channel scales are not supported).
        """
        if which not in ("k", "v"):
            raise ValueError(f"which={which!r} must be 'k' or 'v'.")
        if value.numel() != 1:
            raise ValueError(
                f"{which}_scale of shape {list(value.shape)}: one value per layer is supported "
                "(per-head or per-channel KV-cache scales are not)."
            )
        scale = value.detach().reshape(()).to(device="cpu", dtype=torch.float32)
        number = float(scale)
        if not (number > 0 and number < float("inf")):
            raise ValueError(f"{which}_scale={number} must be positive and finite.")
        getattr(self, f"{which}_scale").copy_(scale)
        setattr(self, f"{which}_scale_float", number)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
        positions: torch.Tensor | None = None,
        rotary_emb: nn.Module | None = None,
    ) -> torch.Tensor:
        """query [T, num_heads*head_size], key/value [T, num_kv_heads*head_size]
        -> [T, num_heads*head_size]; writes key/value into ``kv_cache``.

        With ``rotary_emb`` (a RotaryEmbedding) and ``positions`` [T] int64, query and key
        are rotated first, by the backend, which may fuse the rotation with its cache write;
        without it (None) they are attended to and cached as given.
        """
        return attn_metadata.impl.forward(
            self, query, key, value, kv_cache, attn_metadata, positions, rotary_emb
        )


def check_layers_match_spec(model: nn.Module, spec: AttentionSpec) -> None:
    """Check that every :class:`Attention` layer of ``model`` computes what the backend
    built from ``spec`` plans for: FlashInfer plans its wrappers with the spec's softmax
    scale, windows and score cap, while the other paths read each layer's own.

    Raises:
        ValueError: naming the first layer whose scale is not ``spec.scale`` (or
            ``head_size ** -0.5`` when None), whose window is not among
            ``spec.sliding_windows``, or whose score cap is not ``spec.logits_soft_cap``.
    """
    scale = spec.scale if spec.scale is not None else spec.head_size**-0.5
    for name, layer in model.named_modules():
        if not isinstance(layer, Attention):
            continue
        if layer.scale != scale:
            got = f"softmax scale {layer.scale!r}, the backend's {scale!r}"
        elif layer.sliding_window is not None and layer.sliding_window not in spec.sliding_windows:
            got = f"sliding window {layer.sliding_window}, the backend's {spec.sliding_windows}"
        elif layer.logits_soft_cap != spec.logits_soft_cap:
            got = f"score cap {layer.logits_soft_cap!r}, the backend's {spec.logits_soft_cap!r}"
        else:
            continue
        raise ValueError(
            f"attention layer {name} has {got}: the model's attention_fields "
            "(vllm/model_executor/models/__init__.py) must report it"
        )
