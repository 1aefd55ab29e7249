"""The KV cache's storage dtype (``--kv-cache-dtype``): the model's, or 8-bit floats.

Names, as upstream vLLM spells them: ``auto`` (the model's dtype), ``fp8`` and
``fp8_e4m3`` (``torch.float8_e4m3fn``: 4 exponent bits, 3 mantissa bits, finite range
+-448), ``fp8_e5m2`` (``torch.float8_e5m2``: range +-57344, 2 mantissa bits). An 8-bit
cache holds twice the tokens of a 16-bit one in the same memory (four times float32's).

Scales: per layer, one float32 value for keys (``k_scale``) and one for values
(``v_scale``), loaded from the checkpoint when it has them (compressed-tensors'
``kv_cache_scheme``, vllm/model_executor/layers/kv_scales.py) and 1.0 otherwise, as
upstream. An 8-bit cache stores ``clamp(x / scale, -max, max)`` rounded to the nearest
representable value (:func:`to_cache`); the clamp makes the saturation explicit (the e4m3
conversion has no infinity, and torch's cast of a value past the range is not specified
the same on every device). Attention reads ``stored * scale`` in the model's dtype
(:func:`from_cache`): on every path, the step's own new keys included (:func:`as_stored`),
so a prefill over a cached prefix, a chunked one and a plain one attend to the same values
(on CPU in float32 they give the same tokens and logprobs). A cache of the model's dtype
stores keys and values as they are and its layers' scales are unused
(:func:`layer_kv_scales`).
"""

from __future__ import annotations

import torch

KV_CACHE_DTYPES: dict[str, torch.dtype | None] = {
    "auto": None,
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


def check_kv_cache_dtype(name: str) -> None:
    """Raise unless ``name`` is a KV cache dtype of :data:`KV_CACHE_DTYPES`.

    Raises:
        ValueError: naming ``name`` and the choices.
    """
    if name not in KV_CACHE_DTYPES:
        raise ValueError(
            f"kv_cache_dtype={name!r} is not supported; choose one of "
            f"{', '.join(repr(n) for n in KV_CACHE_DTYPES)}."
        )


def distinct_kv_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype | None:
    """The storage dtype of KV cache dtype ``name`` when it differs from ``model_dtype``,
    else None (the form of ``AttentionSpec.kv_cache_dtype``).

    Raises:
        ValueError: ``name`` is not one of :data:`KV_CACHE_DTYPES`.
    """
    check_kv_cache_dtype(name)
    dtype = KV_CACHE_DTYPES[name] or model_dtype
    return None if dtype == model_dtype else dtype


def is_8bit(dtype: torch.dtype) -> bool:
    """Whether ``dtype`` is one of the 8-bit float cache dtypes."""
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def layer_kv_scales(layer, cache_dtype: torch.dtype) -> tuple[float, float]:
    """(k_scale, v_scale) that a cache of ``cache_dtype`` applies for attention ``layer``:
    the layer's checkpoint scales (its ``k_scale_float`` / ``v_scale_float``,
    :class:`vllm.attention.Attention`) for an 8-bit cache, else (1.0, 1.0) (a cache of the
    model's dtype ignores them, as upstream's ``--kv-cache-dtype auto``). A layer object
    without them (tests pass plain namespaces) has scales 1.0. Python floats: fixed per
    layer, so eager steps and CUDA graphs use the same values."""
    if not is_8bit(cache_dtype):
        return 1.0, 1.0
    return getattr(layer, "k_scale_float", 1.0), getattr(layer, "v_scale_float", 1.0)


def to_cache(x: torch.Tensor, cache_dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """``x`` (any shape, a float dtype) as the cache stores it: itself when ``cache_dtype``
    is its dtype (``scale`` unused), else ``x / scale`` (computed in float32 when
    ``scale`` is not 1) clamped to the 8-bit format's finite range and rounded to it (same
    shape, ``cache_dtype``). ``scale``: a positive float (the layer's ``k_scale`` or
    ``v_scale``)."""
    if x.dtype == cache_dtype:
        return x
    if scale != 1.0:
        x = x.float() / scale
    limit = torch.finfo(cache_dtype).max
    return x.clamp(-limit, limit).to(cache_dtype)


def from_cache(stored: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """The values attention reads from cache entries ``stored`` (any shape): ``stored``
    converted to ``dtype`` (the model's), times ``scale`` when it is not 1 (same shape,
    ``dtype``). Pass the scale of :func:`layer_kv_scales`, which is 1.0 for a cache of the
    model's dtype."""
    out = stored.to(dtype)
    return out if scale == 1.0 else out * scale


def as_stored(x: torch.Tensor, cache_dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """``x`` with the values attention reads back from a ``cache_dtype`` cache at
    ``scale``: :func:`from_cache` of :func:`to_cache`, in ``x``'s dtype (same shape);
    ``x`` itself when the cache keeps its dtype."""
    if x.dtype == cache_dtype:
        return x
    return from_cache(to_cache(x, cache_dtype, scale), x.dtype, scale)


def store_rows(
    cache: torch.Tensor, index: torch.Tensor, x: torch.Tensor, scale: float = 1.0
) -> None:
    """``cache.index_copy_(0, index, to_cache(x, cache.dtype, scale))``: rows ``index`` [n]
    int64 of ``cache`` [rows, ...] get ``x`` [n, ...]. An 8-bit cache is written through a
    uint8 view of both (the same bytes; torch's CPU index_copy has no 8-bit float kernel).
    ``x`` already in the cache's dtype is written as it is."""
    if is_8bit(cache.dtype):
        data = to_cache(x, cache.dtype, scale).view(torch.uint8)  # [n, ...]
        cache.view(torch.uint8).index_copy_(0, index, data)
    else:
        cache.index_copy_(0, index, x)
