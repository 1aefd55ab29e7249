"""Read a single-file GGUF checkpoint as Hugging Face-named float tensors.

Every tensor is dequantized with ``gguf.quants.dequantize`` (numpy, float32). GGUF lists a
tensor's dims fastest-first (``[in, out]``), the reverse of torch; the reader's ``data``
array is already in row-major torch order, which is what we use (and check).

llama.cpp's converter permutes the rows of Llama's ``attn_q``/``attn_k`` so that each head's
rotary pairs are interleaved (GPT-J style): per head, ``w.reshape(2, D/2, in)`` becomes
``w.reshape(D/2, 2, in)``. We undo it per head (interleaved pairs -> halves) to recover the
HF NeoX layout. Qwen2 files are not permuted. Gemma 3 files store every norm weight as
``1 + w`` (llama.cpp's converter), and name its four per-layer norms differently.

``rope_freqs.weight`` (float32 [head_dim / 2]) is no weight but a rope setting: llama.cpp's
converter writes Llama 3.1's llama3 scaling as these per-frequency divisors and no
rope-scaling metadata. :func:`gguf_rope_freq_factors` reads it for the config
(vllm/transformers_utils/gguf_metadata.py); the weight iterator skips it.
"""

import re
from collections.abc import Iterator

import numpy as np
import torch
from tqdm.auto import tqdm

# GGUF per-block sub-name -> HF sub-name under model.layers.N.
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm",  # Qwen3's per-head q/k norms
    "attn_k_norm": "self_attn.k_norm",
}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
# Gemma 2 and 3 have four norms per layer: llama.cpp's ffn_norm is their pre-feed-forward
# norm
_GEMMA_BLOCK_NAMES = {
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_ARCH_BLOCK_NAMES = {"gemma2": _GEMMA_BLOCK_NAMES, "gemma3": _GEMMA_BLOCK_NAMES}
# architectures whose converter stores every norm weight w as 1 + w (Gemma's scale)
_NORM_SHIFTED_ARCHS = {"gemma2", "gemma3"}
ROPE_FREQS = "rope_freqs"
_SKIPPED = {ROPE_FREQS}  # rotary frequency divisors: part of the config, not a weight
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
_PERMUTED_ARCHS = {"llama"}


def gguf_to_hf_name(gguf_name: str, arch: str = "") -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight`` (``arch``: the
    file's ``general.architecture``, for the names that differ per architecture).

    Returns None for tensors that are no weights (``rope_freqs``). Raises ValueError for an
    unknown name.
    """
    match = _BLOCK_RE.match(gguf_name)
    if match:
        layer, sub, kind = match.groups()
        names = {**_BLOCK_NAMES, **_ARCH_BLOCK_NAMES.get(arch, {})}
        if sub in names:
            return f"model.layers.{layer}.{names[sub]}.{kind}"
    else:
        base, _, kind = gguf_name.rpartition(".")
        if base in _SKIPPED:
            return None
        if base in _GLOBAL_NAMES and kind in ("weight", "bias"):
            return f"{_GLOBAL_NAMES[base]}.{kind}"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no Hugging Face name mapping")


def reverse_permute_rows(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k permutation: rows [n_head * D, ...] with interleaved rotary pairs
    per head -> HF layout with the pair halves contiguous (``reshape(n, D/2, 2)`` ->
    ``swap`` -> ``reshape(n, 2, D/2)``)."""
    rows = weight.shape[0]
    if rows % (2 * n_head):
        raise ValueError(f"cannot un-permute {rows} rows over {n_head} heads (needs 2 * heads)")
    w = weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:])
    return w.swapaxes(1, 2).reshape(weight.shape)


def permute_rows(weight: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter permutation (HF -> GGUF), the inverse of reverse_permute_rows."""
    rows = weight.shape[0]
    w = weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:])
    return w.swapaxes(1, 2).reshape(weight.shape)


def gguf_rope_freq_factors(reader) -> list[float] | None:
    """The ``rope_freqs.weight`` tensor of a GGUF file (``reader``: its
    ``gguf.GGUFReader``; float32 [head_dim / 2]: each frequency's divisor) as a list, or
    None when the file has none."""
    import gguf

    for tensor in reader.tensors:
        if tensor.name == f"{ROPE_FREQS}.weight":
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)  # [head_dim / 2]
            return [float(v) for v in np.asarray(values, dtype=np.float32).reshape(-1)]
    return None


_ROPE_SCALING_VALUES = ("factor", "original_context_length", "yarn_beta_fast", "yarn_beta_slow")


def gguf_rope_scaling(reader) -> dict | None:
    """The RoPE scaling in the metadata of a GGUF file (``reader``: its ``gguf.GGUFReader``;
    llama.cpp's ``{arch}.rope.scaling.*`` keys) as ``{"key": "<arch>.rope.scaling.type",
    "type": str, "factor", "original_context_length", "yarn_beta_fast", "yarn_beta_slow":
    each a number or None, "other_keys": [the file's other rope.scaling keys but
    "finetuned", e.g. "<arch>.rope.scaling.yarn_log_multiplier"]}``, or None when the file
    has no scaling type."""
    arch = _field_str(reader, "general.architecture") or ""
    prefix = f"{arch}.rope.scaling."
    kind = _field_str(reader, prefix + "type")
    if kind is None:
        return None
    values = {}
    for name in _ROPE_SCALING_VALUES:
        field = reader.fields.get(prefix + name)
        values[name] = None if field is None else field.contents()
    known = {prefix + n for n in (*_ROPE_SCALING_VALUES, "type", "finetuned")}
    others = sorted(k for k in reader.fields if k.startswith(prefix) and k not in known)
    return {"key": prefix + "type", "type": kind, **values, "other_keys": others}


def gguf_key_length(reader) -> int | None:
    """The attention head size of a GGUF file (``reader``: its ``gguf.GGUFReader``;
    llama.cpp's ``{arch}.attention.key_length``), or None when the file does not state it."""
    arch = _field_str(reader, "general.architecture") or ""
    field = reader.fields.get(f"{arch}.attention.key_length")
    return None if field is None else int(field.contents())


def _field_str(reader, key: str) -> str | None:
    field = reader.fields.get(key)
    if field is None:
        return None
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def gguf_weights_iterator(
    path: str,
    num_heads: int,
    num_kv_heads: int,
    layer_range: tuple[int, int] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, float32 tensor)`` for every tensor of the GGUF file at ``path``.

    Args:
        num_heads, num_kv_heads: the model's attention heads, for un-permuting Llama q/k.
        layer_range: ``(start, end)``: decoder-layer tensors outside it are skipped before
            dequantizing (a pipeline stage reads only its own layers).

    Raises:
        ValueError: an unmapped tensor name or an unexpected dequantized shape.
    """
    import gguf

    from vllm.model_executor.model_loader.gguf_tensor_reader import read_gguf_tensors

    reader = read_gguf_tensors(path)  # the tokenizer's arrays are not needed here
    arch = _field_str(reader, "general.architecture") or ""
    permuted = arch in _PERMUTED_ARCHS
    norm_shifted = arch in _NORM_SHIFTED_ARCHS
    for tensor in tqdm(reader.tensors, desc="Loading gguf weights", unit="tensor"):
        hf_name = gguf_to_hf_name(tensor.name, arch)
        if hf_name is None:
            continue
        if layer_range is not None and hf_name.startswith("model.layers."):
            if not layer_range[0] <= int(hf_name.split(".")[2]) < layer_range[1]:
                continue
        array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)  # torch order
        expected = tuple(int(d) for d in reversed(tensor.shape))  # GGUF dims are reversed
        if tuple(array.shape) != expected:
            raise ValueError(
                f"GGUF tensor {tensor.name!r}: dequantized shape {tuple(array.shape)}, "
                f"expected {expected} (reversed GGUF dims {list(tensor.shape)})"
            )
        if permuted and ".self_attn.q_proj." in hf_name:
            array = reverse_permute_rows(array, num_heads)
        elif permuted and ".self_attn.k_proj." in hf_name:
            array = reverse_permute_rows(array, num_kv_heads)
        elif norm_shifted and hf_name.endswith("norm.weight"):
            array = array - 1.0  # the file holds 1 + w; GemmaRMSNorm adds the 1 back
        array = np.ascontiguousarray(array, dtype=np.float32)
        if not array.flags.writeable:  # F32 tensors come back as views of the read-only mmap
            array = array.copy()
        yield hf_name, torch.from_numpy(array)
