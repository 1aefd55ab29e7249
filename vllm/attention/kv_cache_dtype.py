"""The KV cache's storage dtype (``--kv-cache-dtype``): the model's, or 8-bit floats.

Names, as upstream vLLM spells them: ``auto`` (the model's dtype), ``fp8`` and
``fp8_e4m3`` (``torch.float8_e4m3fn``: 4 exponent bits, 3 mantissa bits, finite range
+-448), ``fp8_e5m2`` (``torch.float8_e5m2``: range +-57344, 2 mantissa bits). An 8-bit
cache holds twice the tokens of a 16-bit one in the same memory (four times float32's).

Scale: none (1.0), upstream's default when a checkpoint carries no KV scales. A key or
value is stored as ``clamp(x, -max, max)`` rounded to the nearest representable value
(:func:`to_cache`); the clamp makes the saturation explicit (the e4m3 conversion has no
infinity, and torch's cast of a value past the range is not specified the same on every
device). Attention then reads the stored values converted back to the model's dtype: on
every path, the step's own new keys included (:func:`as_stored`), so a prefill over a
cached prefix, a chunked one and a plain one attend to the same values (on CPU in float32
they give the same tokens and logprobs).
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


def to_cache(x: torch.Tensor, cache_dtype: torch.dtype) -> torch.Tensor:
    """``x`` (any shape, a float dtype) as the cache stores it: itself when ``cache_dtype``
    is its dtype, else clamped to the 8-bit format's finite range and rounded to it (same
    shape, ``cache_dtype``)."""
    if x.dtype == cache_dtype:
        return x
    limit = torch.finfo(cache_dtype).max
    return x.clamp(-limit, limit).to(cache_dtype)


def as_stored(x: torch.Tensor, cache_dtype: torch.dtype) -> torch.Tensor:
    """``x`` with the values attention reads back from a ``cache_dtype`` cache: the
    rounding of :func:`to_cache`, in ``x``'s dtype (same shape); ``x`` itself when the
    cache keeps its dtype."""
    if x.dtype == cache_dtype:
        return x
    return to_cache(x, cache_dtype).to(x.dtype)


def store_rows(cache: torch.Tensor, index: torch.Tensor, x: torch.Tensor) -> None:
    """``cache.index_copy_(0, index, to_cache(x, cache.dtype))``: rows ``index`` [n] int64
    of ``cache`` [rows, ...] get ``x`` [n, ...]. An 8-bit cache is written through a uint8
    view of both (the same bytes; torch's CPU index_copy has no 8-bit float kernel)."""
    if is_8bit(cache.dtype):
        data = to_cache(x, cache.dtype).view(torch.uint8)  # [n, ...]
        cache.view(torch.uint8).index_copy_(0, index, data)
    else:
        cache.index_copy_(0, index, x)
