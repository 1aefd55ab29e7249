"""YaRN RoPE scaling (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large
Language Models"), as transformers' ``modeling_rope_utils`` computes it for
``rope_type="yarn"`` (Qwen2.5, Qwen3 and others document it for contexts past their
original window).

Per frequency ``i`` of ``inv_freq = 1 / theta ** (2i / D)``:

- the wavelengths that fit many times in the original context (``i`` below ``low``) keep
  their frequency (extrapolation);
- the long ones (``i`` above ``high``) are divided by ``factor`` (interpolation);
- in between, a linear ramp over ``i`` blends the two.

``low`` and ``high`` are the dimensions whose frequency turns ``beta_fast`` (default 32) and
``beta_slow`` (default 1) times over ``original_max_position_embeddings`` positions
(``truncate``, default True, rounds them outward to integers). cos and sin are then scaled by
an attention factor: ``attention_factor`` if given, else ``0.1 * ln(factor) + 1`` (or, with
both ``mscale`` and ``mscale_all_dim``, the ratio of that expression with each as the
multiplier of ``ln(factor)``; 1.0 when ``factor <= 1``). Without ``factor``:
``max_position_embeddings / original_max_position_embeddings``.
"""

import math
from typing import Any

import torch

DEFAULT_BETA_FAST = 32
DEFAULT_BETA_SLOW = 1


def yarn_original_context(params: dict[str, Any], max_position: int | None) -> int:
    """``original_max_position_embeddings``, defaulting to ``max_position`` (the model's
    ``max_position_embeddings``) as transformers' rope standardization does.

    Raises:
        ValueError: neither is known.
    """
    original = params.get("original_max_position_embeddings") or max_position
    if not original:
        raise ValueError("yarn rope scaling needs original_max_position_embeddings")
    return int(original)


def yarn_factor(params: dict[str, Any], max_position: int | None) -> float:
    """The scaling ``factor``; without one, ``max_position / original context``.

    Raises:
        ValueError: neither ``factor`` nor ``max_position`` is known.
    """
    factor = params.get("factor")
    if factor is None:
        if not max_position:
            raise ValueError("yarn rope scaling needs a factor")
        return max_position / yarn_original_context(params, max_position)
    return float(factor)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """``0.1 * mscale * ln(scale) + 1`` (YaRN's Eq. 21), 1.0 when ``scale <= 1``."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_attention_factor(params: dict[str, Any], max_position: int | None) -> float:
    """YaRN's cos/sin scale for ``params`` (module docstring)."""
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    factor = yarn_factor(params, max_position)
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return float(yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim))
    return yarn_mscale(factor)


def _correction_dim(rotations: float, dim: int, base: float, context: int) -> float:
    """The (fractional) dimension index whose frequency turns ``rotations`` times over
    ``context`` positions."""
    return dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(base))


def yarn_ramp_bounds(
    params: dict[str, Any], dim: int, max_position: int | None
) -> tuple[float, float]:
    """(low, high): the dimension range over which YaRN blends extrapolated and interpolated
    frequencies, clipped to [0, dim - 1]."""
    base = params["rope_theta"]
    context = yarn_original_context(params, max_position)
    beta_fast = params.get("beta_fast") or DEFAULT_BETA_FAST
    beta_slow = params.get("beta_slow") or DEFAULT_BETA_SLOW
    low = _correction_dim(beta_fast, dim, base, context)
    high = _correction_dim(beta_slow, dim, base, context)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def yarn_inv_freq(
    rotary_dim: int, params: dict[str, Any], max_position: int | None
) -> torch.Tensor:
    """YaRN inverse frequencies [rotary_dim // 2] float32 (module docstring), with
    transformers' float32 rounding points so results are bit-identical."""
    base = params["rope_theta"]
    factor = yarn_factor(params, max_position)
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).to(torch.float) / rotary_dim
    wavelength_scale = base**exponents  # [rotary_dim // 2], 1 / inv_freq
    extrapolated = 1.0 / wavelength_scale
    interpolated = 1.0 / (factor * wavelength_scale)
    low, high = yarn_ramp_bounds(params, rotary_dim, max_position)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    index = torch.arange(rotary_dim // 2, dtype=torch.float32)  # [rotary_dim // 2]
    ramp = torch.clamp((index - low) / (high - low), 0, 1)  # 0: keep, 1: divide by factor
    keep = 1 - ramp
    return interpolated * (1 - keep) + extrapolated * keep


def yarn_context_length(config: Any) -> int | None:
    """The context a YaRN-scaled model supports, ``original_max_position_embeddings *
    factor``, as upstream vLLM derives its default ``max_model_len``; None for a config
    without one flat yarn ``rope_parameters`` / ``rope_scaling`` dict (per-layer-type rope
    settings, such as Gemma 3's, keep ``max_position_embeddings`` as upstream does)."""
    params: dict[str, Any] = {}
    for source in (getattr(config, "rope_scaling", None), getattr(config, "rope_parameters", None)):
        if isinstance(source, dict):  # merged as the rotary embedding reads them
            if any(isinstance(v, dict) for v in source.values()):
                return None
            params.update(source)
    if params.get("rope_type", params.get("type")) != "yarn":
        return None
    max_position = getattr(config, "max_position_embeddings", None)
    original = yarn_original_context(params, max_position)
    return int(original * yarn_factor(params, max_position))


def gguf_yarn_parameters(scaling: dict[str, Any]) -> dict[str, Any]:
    """The yarn ``rope_parameters`` of a GGUF file whose ``{arch}.rope.scaling.type`` is
    ``yarn`` (``scaling`` as ``gguf_loader.gguf_rope_scaling`` returns it), as llama.cpp
    reads the file: ``factor`` from ``.factor``, the original context from
    ``.original_context_length`` (llama.cpp's fallback, the file's context length, is the
    config's ``max_position_embeddings``: left unset), ``beta_fast`` / ``beta_slow`` from
    ``.yarn_beta_fast`` / ``.yarn_beta_slow`` (default 32 / 1, llama.cpp's too). llama.cpp's
    ``ggml_rope_yarn`` then blends the same kept and interpolated angles over the same
    rounded dimension range and scales cos / sin by ``1 + 0.1 * ln(factor)``.

    Raises:
        ValueError: the file has other ``rope.scaling`` keys (``attn_factor``,
            ``yarn_log_multiplier``, ...), naming them: llama.cpp's treatment of those is
            not implemented.
    """
    if scaling.get("other_keys"):
        raise ValueError(
            f"GGUF {scaling['key']}='yarn' with {scaling['other_keys']} is not supported "
            "(YaRN from GGUF metadata reads factor, original_context_length, yarn_beta_fast "
            "and yarn_beta_slow); --hf-config-path can name a Hugging Face config instead"
        )
    params: dict[str, Any] = {"rope_type": "yarn", "factor": float(scaling["factor"])}
    if scaling.get("original_context_length"):
        params["original_max_position_embeddings"] = int(scaling["original_context_length"])
    for name in ("beta_fast", "beta_slow"):
        if scaling.get(f"yarn_{name}") is not None:
            params[name] = float(scaling[f"yarn_{name}"])
    return params
