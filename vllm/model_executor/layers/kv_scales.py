"""KV-cache scales in checkpoints: which tensor names hold them and where they load.

A checkpoint quantized with a KV-cache scheme (compressed-tensors' ``kv_cache_scheme``,
ModelOpt's or AutoFP8's KV-cache quantization) stores one scale per layer for keys and one
for values. With an 8-bit cache (``--kv-cache-dtype fp8 | fp8_e4m3 | fp8_e5m2``) the
cache stores ``x / scale`` and attention reads ``stored * scale``
(vllm/attention/kv_cache_dtype.py); with ``auto`` the scales load and are unused, as
upstream. The spellings accepted, for a layer whose attention module is
``model.layers.N.self_attn`` (its :class:`vllm.attention.Attention` is ``...self_attn.attn``):

- ``self_attn.k_scale`` / ``self_attn.v_scale`` (compressed-tensors, current
  llm-compressor releases), or already ``self_attn.attn.k_scale`` / ``.v_scale``;
- ``self_attn.k_proj.output_scale`` / ``self_attn.v_proj.output_scale`` (older
  llm-compressor releases: the k / v projections' output activation scales);
- ``self_attn.k_proj.k_scale`` / ``self_attn.v_proj.v_scale`` (ModelOpt);
- ``self_attn.kv_scale`` (AutoFP8: one scale for keys and values alike).

Scales attention does not use here (``q_scale``, ``prob_scale``, ``q_proj.output_scale``:
upstream uses them only for fp8 attention kernels) are skipped, as is a KV scale whose
layer holds no :class:`~vllm.attention.Attention` (one warning for the whole load, see
:func:`log_skipped`); neither stops the load.
"""

from __future__ import annotations

import logging

from torch import nn

from vllm.model_executor.weight_utils import as_tensor

logger = logging.getLogger(__name__)

# checkpoint name suffix after the attention module -> the scales it sets ("k", "v");
# longer suffixes first, so ".k_proj.k_scale" is not read as ".k_scale"
_KV_SUFFIXES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (".attn.k_scale", ("k",)),
    (".attn.v_scale", ("v",)),
    (".k_proj.output_scale", ("k",)),
    (".v_proj.output_scale", ("v",)),
    (".k_proj.k_scale", ("k",)),
    (".v_proj.v_scale", ("v",)),
    (".k_scale", ("k",)),
    (".v_scale", ("v",)),
    (".kv_scale", ("k", "v")),
)
# attention scales of fp8 attention kernels (queries, probabilities), unused here
_UNUSED_SUFFIXES = (".q_scale", ".prob_scale", ".q_proj.output_scale")
_ATTN = ".self_attn"


def kv_scale_target(name: str) -> tuple[str, tuple[str, ...]] | None:
    """Where checkpoint tensor ``name`` loads if it is a KV-cache scale: (the attention
    module's name in the model, e.g. ``model.layers.0.self_attn.attn``; the scales it sets,
    ``("k",)``, ``("v",)`` or ``("k", "v")``), else None (the module docstring lists the
    spellings)."""
    for suffix, which in _KV_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)].endswith(_ATTN):
            return f"{name[: -len(suffix)]}.attn", which
    return None


def is_attention_scale(name: str) -> bool:
    """Whether ``name`` is a KV-cache scale (:func:`kv_scale_target`) or another scale of
    a layer's attention that is skipped (``q_scale``, ``prob_scale``,
    ``q_proj.output_scale``)."""
    if kv_scale_target(name) is not None:
        return True
    return any(
        name.endswith(s) and name[: -len(s)].endswith((_ATTN, f"{_ATTN}.attn"))
        for s in _UNUSED_SUFFIXES
    )


def load_attention_scale(model: nn.Module, name: str, loaded, skipped: list[str]) -> bool:
    """Load checkpoint tensor ``name`` if it is an attention scale (:func:`is_attention_scale`).

    A KV-cache scale goes into its layer's :class:`~vllm.attention.Attention` through
    ``set_kv_scale`` (``kv_scale`` into both its key and value scales); other attention
    scales, and KV-cache scales of a layer without such a module, are appended to
    ``skipped`` (see :func:`log_skipped`).

    Args:
        model: the model being loaded (its module names are the checkpoint's).
        name: the checkpoint tensor's name.
        loaded: the tensor (or a lazy safetensors slice): one value.
        skipped: the names skipped so far, appended to.

    Returns:
        True when ``name`` was an attention scale (loaded or skipped), False otherwise
        (the caller loads it as a weight).

    Raises:
        ValueError: a KV-cache scale that is not one positive finite value, naming it.
    """
    target = kv_scale_target(name)
    if target is None:
        if is_attention_scale(name):
            skipped.append(name)
            return True
        return False
    module_name, which = target
    try:
        attn = model.get_submodule(module_name)
    except AttributeError:
        attn = None
    if not hasattr(attn, "set_kv_scale"):
        skipped.append(name)
        return True
    value = as_tensor(loaded)
    for w in which:
        try:
            attn.set_kv_scale(w, value)
        except ValueError as e:
            raise ValueError(f"checkpoint tensor {name!r}: {e}") from e
    return True


def log_skipped(skipped: list[str]) -> None:
    """One warning naming the attention scales :func:`load_attention_scale` skipped (the
    first three and a count), if any."""
    if skipped:
        shown = ", ".join(repr(n) for n in skipped[:3]) + (" ..." if len(skipped) > 3 else "")
        logger.warning(
            "Skipped %d attention scale tensors of the checkpoint (%s): only KV-cache scales "
            "of the model's attention layers are used.",
            len(skipped),
            shown,
        )


def kv_scales_of(model: nn.Module) -> list[tuple[float, float]]:
    """(k_scale, v_scale) of each attention layer of ``model`` (those that have the
    scales: :class:`~vllm.attention.Attention`), in module order, as Python floats (1.0
    where the checkpoint had none)."""
    return [
        (m.k_scale_float, m.v_scale_float) for m in model.modules() if hasattr(m, "set_kv_scale")
    ]
