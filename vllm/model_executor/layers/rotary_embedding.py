"""Rotary position embedding (RoPE, Su et al. 2021) with a precomputed cos/sin cache.

NeoX style, as Hugging Face Llama's ``rotate_half``: a head vector ``x`` of size ``D`` is
split into halves ``x1 = x[:D/2]``, ``x2 = x[D/2:]`` and rotated by the angles
``pos * inv_freq``::

    out = [x1 * cos - x2 * sin, x2 * cos + x1 * sin]

Partial rotary (Phi-4-mini, ``partial_rotary_factor`` 0.75): only the first ``rotary_dim``
channels of each head rotate, as halves of those channels (``x[:rd/2]``, ``x[rd/2:rd]``);
channels ``rd..D`` pass through unchanged, and the frequencies are computed for
``rotary_dim``, as transformers' Phi-3 ``apply_rotary_pos_emb`` and rope utils do
(:func:`partial_rotary_dim`).

Interleaved (GPT-J style, ``interleaved=True``; GLM-4): the rotated channels pair up as
``(x[2i], x[2i + 1])`` instead of halves, each pair turned by angle ``i``::

    out[2i] = x[2i] * cos_i - x[2i + 1] * sin_i,  out[2i + 1] = x[2i + 1] * cos_i + x[2i] * sin_i

as transformers' ``Glm4`` ``apply_rotary_pos_emb`` (cos / sin ``repeat_interleave``-d, its
``rotate_half`` over even / odd channels). The cos/sin table is the same; only the Triton
kernels and the fused decode kernel implement the halves, so an interleaved rotation always
runs :meth:`RotaryEmbedding.forward_native`.

The inverse frequencies follow transformers' ``modeling_rope_utils`` for the rope types
``default``, ``linear`` (inv_freq / factor), ``llama3`` (wavelength-banded scaling),
``longrope`` (Phi-3: per-frequency short / long factors, cos and sin scaled by an attention
factor) and ``yarn`` (:mod:`vllm.model_executor.layers.yarn_rope`: a ramp between kept and
interpolated frequencies, cos and sin scaled by an attention factor), so float32 results are
bit-identical to the reference. The attention factors live in the cos/sin table, which every
path (torch, the CUDA Triton kernels) reads.

Any rope type may also carry ``freq_factors``: one divisor per frequency, applied after the
type's own scaling, as llama.cpp applies a GGUF file's ``rope_freqs`` tensor (its converter
stores Llama 3.1's llama3 scaling that way, with no rope-scaling metadata).
"""

import math
from typing import Any

import torch
from torch import nn

from vllm.kernels.dispatch import get_triton_ops
from vllm.model_executor.layers.yarn_rope import (
    gguf_yarn_parameters,
    yarn_attention_factor,
    yarn_inv_freq,
)

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope", "yarn")


def compute_inv_freq(
    rotary_dim: int,
    rope_parameters: dict[str, Any],
    long: bool = False,
    max_position: int | None = None,
) -> torch.Tensor:
    """Inverse frequencies [rotary_dim // 2] in float32 for ``rope_parameters``.

    ``rope_parameters`` holds ``rope_theta`` and ``rope_type`` (plus ``factor``,
    ``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings`` for
    llama3; ``short_factor`` and ``long_factor`` for longrope, ``long`` picking the second;
    yarn's keys in :mod:`~vllm.model_executor.layers.yarn_rope`, where ``max_position``, the
    model's ``max_position_embeddings``, stands in for a missing ``factor`` or original
    context). Formula: ``1 / theta ** (arange(0, D, 2) / D)`` (RoFormer / transformers). Optional
    ``freq_factors`` (any type; rotary_dim // 2 numbers): the result is divided by them
    elementwise (llama.cpp's ``rope_freqs``, module docstring).

    Raises:
        ValueError: a rope type outside ``SUPPORTED_ROPE_TYPES``, or longrope factors or
            ``freq_factors`` whose length is not rotary_dim // 2.
    """
    rope_type = supported_rope_type(rope_parameters)
    base = rope_parameters["rope_theta"]
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).to(torch.float) / rotary_dim
    if rope_type == "longrope":
        key = "long_factor" if long else "short_factor"
        ext = _per_frequency(rope_parameters[key], rotary_dim, f"longrope {key}")
        inv_freq = 1.0 / (ext * base**exponents)  # [rotary_dim // 2]
    else:
        inv_freq = 1.0 / (base**exponents)  # [rotary_dim // 2]
    if rope_type == "linear":
        inv_freq = inv_freq / rope_parameters["factor"]
    elif rope_type == "llama3":
        inv_freq = _llama3_scale(inv_freq, rope_parameters)
    elif rope_type == "yarn":
        inv_freq = yarn_inv_freq(rotary_dim, rope_parameters, max_position)
    if rope_parameters.get("freq_factors") is not None:
        divisors = _per_frequency(rope_parameters["freq_factors"], rotary_dim, "freq_factors")
        inv_freq = inv_freq / divisors  # [rotary_dim // 2]
    return inv_freq


def _per_frequency(values: Any, rotary_dim: int, what: str) -> torch.Tensor:
    """``values`` as a float32 tensor [rotary_dim // 2].

    Raises:
        ValueError: another number of values (naming ``what``).
    """
    if len(values) != rotary_dim // 2:
        raise ValueError(
            f"{what} has {len(values)} entries, expected rotary_dim // 2 = {rotary_dim // 2}"
        )
    return torch.tensor(values, dtype=torch.float32)  # [rotary_dim // 2]


def set_freq_factors(config: Any, factors: list[float]) -> None:
    """Give ``config``'s rope settings llama.cpp's per-frequency divisors (``freq_factors``,
    see :func:`compute_inv_freq`): added to transformers 5's ``rope_parameters`` dict.

    Raises:
        ValueError: a config without one flat ``rope_parameters`` dict (per-layer-type rope
            settings, such as Gemma 3's, or a config from before transformers 5).
    """
    params = getattr(config, "rope_parameters", None)
    if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
        raise ValueError(
            f"rope frequency factors (a GGUF rope_freqs tensor) need a config with one "
            f"rope_parameters dict, got rope_parameters={params!r}"
        )
    params["freq_factors"] = [float(f) for f in factors]


def set_gguf_rope_scaling(config: Any, scaling: dict[str, Any]) -> None:
    """Give ``config`` the RoPE scaling of a GGUF file's metadata (``scaling`` as
    ``gguf_loader.gguf_rope_scaling`` returns it). ``none`` changes nothing; ``linear``
    becomes ``rope_type="linear"`` with the file's factor in transformers 5's
    ``rope_parameters``: the flat dict, or with per-layer-type settings (Gemma 3) the
    ``full_attention`` layers' only, as llama.cpp scales only Gemma 3's global layers.
    ``yarn`` becomes ``rope_type="yarn"`` the same way
    (:func:`~vllm.model_executor.layers.yarn_rope.gguf_yarn_parameters`).

    Raises:
        ValueError: another scaling type, naming the metadata key (only 'none', 'linear'
            and 'yarn' are implemented); a scaling without a factor; a YaRN file with
            keys whose llama.cpp meaning is not implemented; a config without
            ``rope_parameters``.
    """
    kind, key = scaling["type"], scaling["key"]
    if kind == "none":
        return
    if kind not in ("linear", "yarn"):
        raise ValueError(
            f"GGUF {key}={kind!r} is not supported (RoPE scaling from GGUF metadata: "
            "'none', 'linear' or 'yarn')"
        )
    if not scaling.get("factor"):
        raise ValueError(f"GGUF {key}={kind!r} needs a positive rope.scaling.factor")
    params = getattr(config, "rope_parameters", None)
    if not isinstance(params, dict):
        raise ValueError(f"GGUF {key}={kind!r} needs a config with rope_parameters")
    if isinstance(params.get("full_attention"), dict):
        params = params["full_attention"]
    if kind == "yarn":
        params.update(gguf_yarn_parameters(scaling))
        return
    params["rope_type"] = "linear"
    params["factor"] = float(scaling["factor"])


def _llama3_scale(inv_freq: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1 frequency scaling: long wavelengths divided by ``factor``, short ones kept,
    a linear blend in between (Meta's reference ``apply_scaling``)."""
    factor = params["factor"]
    low_freq_factor = params["low_freq_factor"]
    high_freq_factor = params["high_freq_factor"]
    old_context_len = params["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def longrope_attention_factor(rope_parameters: dict[str, Any], max_position: int) -> float:
    """LongRoPE's cos/sin scale: ``attention_factor`` if given, else
    ``sqrt(1 + ln(s) / ln(original_max))`` with ``s = factor`` or, without it,
    ``max_position / original_max`` (1.0 when ``s <= 1``), as transformers."""
    if rope_parameters.get("attention_factor") is not None:
        return float(rope_parameters["attention_factor"])
    original = rope_parameters["original_max_position_embeddings"]
    factor = rope_parameters.get("factor") or max_position / original
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def partial_rotary_dim(config: Any, head_dim: int) -> int:
    """How many channels of each ``head_dim``-wide head rotate under ``config``:
    ``int(head_dim * partial_rotary_factor)``, as transformers computes it. The factor is
    read from ``rope_parameters["partial_rotary_factor"]`` (where transformers 5 keeps it),
    else from ``config.partial_rotary_factor``; 1.0 when neither sets it.

    Raises:
        ValueError: a factor outside (0, 1], or one whose rotary_dim is odd or 0 (naming
            the factor, the head_dim and the rotary_dim).
    """
    factor = get_rope_parameters(config).get("partial_rotary_factor")
    if factor is None:
        factor = getattr(config, "partial_rotary_factor", None)
    if factor is None:
        return head_dim
    try:
        factor = float(factor)
    except (TypeError, ValueError):
        raise ValueError(f"partial_rotary_factor={factor!r} must be a number in (0, 1]") from None
    if not 0.0 < factor <= 1.0:
        raise ValueError(f"partial_rotary_factor={factor} must be in (0, 1]")
    rotary_dim = int(head_dim * factor)
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(
            f"partial_rotary_factor={factor} gives rotary_dim = int({head_dim} * {factor}) = "
            f"{rotary_dim}; it must be even and at least 2"
        )
    return rotary_dim


class RotaryEmbedding(nn.Module):
    """Applies RoPE to flattened query/key tensors, looking angles up by position.

    Args:
        head_size: channels per head.
        rotary_dim: how many of them rotate (the first ``rotary_dim``; even, at most
            ``head_size``); the rest pass through unchanged (module docstring).
        max_position: the model's ``max_position_embeddings``, the context it was trained
            for; LongRoPE derives its attention factor from it, YaRN its factor when the
            config gives none.
        rope_parameters: :func:`get_rope_parameters` of the config.
        num_positions: rows of the cos/sin table (default ``max_position``): the engine's
            ``max_model_len`` when that is longer. More rows change no row's value.
        interleaved: rotate pairs of adjacent channels (GPT-J style, GLM-4) instead of
            halves (NeoX style, the default); module docstring.

    ``cos_sin_cache`` [num_positions, rotary_dim] (float32, non-persistent buffer) holds
    ``cat(cos(pos * inv_freq), sin(pos * inv_freq))`` for every position below
    ``num_positions``.

    longrope: rows below ``original_max_position_embeddings`` use the short factors, rows
    at or above it the long ones, both times the attention factor. transformers' Phi-3
    instead rotates the whole sequence with the long factors once it is longer than
    ``original_max_position_embeddings`` (its generate recomputes the cache at the switch);
    a paged cache keeps the keys already written, so the two agree exactly while the
    sequence fits in the original context and differ in the first rows' keys beyond it.

    yarn: one set of frequencies for every row (as transformers), times the attention factor.
    """

    def __init__(
        self,
        head_size: int,
        rotary_dim: int,
        max_position: int,
        rope_parameters: dict[str, Any],
        num_positions: int | None = None,
        interleaved: bool = False,
    ) -> None:
        super().__init__()
        if rotary_dim % 2 or not 2 <= rotary_dim <= head_size:
            raise ValueError(
                f"rotary_dim={rotary_dim} must be even and in [2, head_size={head_size}]"
            )
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.interleaved = interleaved
        self.max_position = max_position
        self.num_positions = num_positions or max_position
        positions = torch.arange(self.num_positions, dtype=torch.float32)  # [num_positions]
        inv_freq = compute_inv_freq(rotary_dim, rope_parameters, max_position=max_position)
        cache = self._cos_sin(positions, inv_freq)
        rope_type = rope_parameters.get("rope_type", rope_parameters.get("type", "default"))
        if rope_type == "longrope":
            original = int(rope_parameters["original_max_position_embeddings"])
            long_inv_freq = compute_inv_freq(rotary_dim, rope_parameters, long=True)
            cache[original:] = self._cos_sin(positions[original:], long_inv_freq)
            cache = cache * longrope_attention_factor(rope_parameters, max_position)
        elif rope_type == "yarn":
            cache = cache * yarn_attention_factor(rope_parameters, max_position)
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    @property
    def whole_head_halves(self) -> bool:
        """Whether the rotation is the one fused kernels implement (NeoX halves over whole
        heads); otherwise a caller rotates with this module before such a kernel."""
        return self.rotary_dim == self.head_size and not self.interleaved

    @staticmethod
    def _cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
        """positions [P] float32, inv_freq [D/2] -> cat(cos, sin) [P, D] float32."""
        # Elementwise product as transformers computes it (position.float() * inv_freq).
        freqs = positions[:, None] * inv_freq[None, :]  # [P, rotary_dim // 2]
        return torch.cat((freqs.cos(), freqs.sin()), dim=-1)  # [P, rotary_dim]

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate query and key.

        Args:
            positions: [num_tokens] int64, each below ``num_positions``.
            query: [num_tokens, num_heads * head_size].
            key: [num_tokens, num_kv_heads * head_size].

        Returns:
            (query, key) rotated, same shapes and dtype as the inputs. On CUDA (one fused
            Triton kernel, ``norm_rotary.rotary_embedding``) the rotation is written IN PLACE
            into 2-D query/key views (the qkv split): the caller must use the returned
            tensors and not expect the un-rotated values. Elsewhere, and for an interleaved
            rotation, ``forward_native`` runs.
        """
        ops = None if self.interleaved else get_triton_ops(query)
        if ops is None:
            return self.forward_native(positions, query, key)
        return ops.rotary_embedding(positions, query, key, self.cos_sin_cache, self.head_size)

    def forward_and_cache(
        self,
        positions: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        kv_rows: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """:meth:`forward`, and on the Triton path also the cache write of the rotated key
        and the value in the same launch (saves an attention backend its write kernels).

        Args:
            value: [num_tokens, num_kv_heads * head_size].
            kv_cache: [cache rows, num_kv_heads * head_size], a flat view of the paged cache.
            kv_rows: [2, num_tokens] int64, each token's key row and value row.
        Returns:
            (query, key, written): rotated tensors, and whether the cache was written (False
            off the Triton path, interleaved included: the caller writes it).
        """
        ops = None if self.interleaved else get_triton_ops(query)
        if ops is None:
            q, k = self.forward_native(positions, query, key)
            return q, k, False
        q, k = ops.rotary_embedding(
            positions, query, key, self.cos_sin_cache, self.head_size, value, kv_cache, kv_rows
        )
        return q, k, True

    def forward_native(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The torch reference of :meth:`forward`: out of place, cos/sin rounded to the
        activation dtype first as HF does (runs on any device)."""
        cos_sin = self.cos_sin_cache.index_select(0, positions)  # [T, rotary_dim]
        cos, sin = cos_sin.chunk(2, dim=-1)  # [T, rotary_dim // 2] each
        # HF casts cos/sin to the activation dtype before applying them.
        cos = cos.to(query.dtype).unsqueeze(1)  # [T, 1, rotary_dim // 2]
        sin = sin.to(query.dtype).unsqueeze(1)
        return self._rotate(query, cos, sin), self._rotate(key, cos, sin)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [T, heads * head_size], cos / sin [T, 1, rotary_dim // 2] -> x rotated (a new
        tensor, same shape): the first rotary_dim channels of each head, the rest copied."""
        num_tokens, rd = x.shape[0], self.rotary_dim
        x = x.view(num_tokens, -1, self.head_size)  # [T, heads, head_size]
        if self.interleaved:
            x1, x2 = x[..., 0:rd:2], x[..., 1:rd:2]  # [T, heads, rotary_dim // 2] each
            pairs = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
            parts = [pairs.flatten(-2)]  # [T, heads, rotary_dim], pairs back in place
        else:
            x1, x2 = x[..., :rd].chunk(2, dim=-1)  # [T, heads, rotary_dim // 2] each
            parts = [x1 * cos - x2 * sin, x2 * cos + x1 * sin]
        if rd < self.head_size:
            parts.append(x[..., rd:])  # [T, heads, head_size - rotary_dim], not rotated
        out = torch.cat(parts, dim=-1)  # [T, heads, head_size]
        return out.reshape(num_tokens, -1)  # [T, heads * head_size]

    def extra_repr(self) -> str:
        return (
            f"head_size={self.head_size}, rotary_dim={self.rotary_dim}, "
            f"max_position={self.max_position}, num_positions={self.num_positions}, "
            f"interleaved={self.interleaved}"
        )


def check_rope_types(config: Any) -> None:
    """Refuse a config whose RoPE type (any layer type's, for configs that set one per layer
    type as Gemma 3's) the rotary embedding does not implement, when the config is
    validated rather than when the model is built.

    Raises:
        ValueError: naming the type and the supported ones (``SUPPORTED_ROPE_TYPES``).
    """
    params = getattr(config, "rope_parameters", None)
    per_layer = (
        [v for v in params.values() if isinstance(v, dict)] if isinstance(params, dict) else []
    )
    for p in per_layer or [get_rope_parameters(config)]:
        supported_rope_type(p)


def supported_rope_type(rope_parameters: dict[str, Any]) -> str:
    """The ``rope_type`` of one set of rope parameters (``type`` is its old spelling;
    default "default").

    Raises:
        ValueError: a type outside ``SUPPORTED_ROPE_TYPES``, naming it and the supported.
    """
    rope_type = rope_parameters.get("rope_type", rope_parameters.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope_type={rope_type!r} is not supported; supported: {list(SUPPORTED_ROPE_TYPES)}"
        )
    return rope_type


def get_rope_parameters(config: Any) -> dict[str, Any]:
    """Rope settings of a transformers config as one dict with ``rope_theta`` and ``rope_type``.

    transformers 5 stores them in ``config.rope_parameters``; older configs in
    ``config.rope_theta`` plus an optional ``config.rope_scaling`` dict (whose ``type`` key
    is an old spelling of ``rope_type``). Default theta 10000.
    """
    params = getattr(config, "rope_parameters", None)
    merged: dict[str, Any] = {}
    scaling = getattr(config, "rope_scaling", None)
    if isinstance(scaling, dict):
        merged.update(scaling)
    if isinstance(params, dict):
        merged.update(params)
    if "rope_theta" not in merged:
        merged["rope_theta"] = getattr(config, "rope_theta", None) or 10000.0
    if "rope_type" not in merged:
        merged["rope_type"] = merged.get("type", "default")
    return merged
