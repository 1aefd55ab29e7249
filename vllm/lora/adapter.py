"""Reading a PEFT LoRA adapter directory and checking it against the served model.

A PEFT adapter (``save_pretrained`` of a ``LoraConfig`` model) is a directory with
``adapter_config.json`` (``r``, ``lora_alpha``, ``target_modules``, ``use_rslora``, ...) and
``adapter_model.safetensors`` (or ``adapter_model.bin``) holding, per adapted linear layer
``W`` [out, in] of decoder layer ``i``::

    base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight   # A [r, in]
    base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight   # B [out, r]

The adapted layer computes ``W x + scale * B (A x)`` with ``scale = lora_alpha / r``, or
``lora_alpha / sqrt(r)`` with ``use_rslora`` (PEFT's ``LoraLayer.update_layer``). Only
linear layers of the decoder are served (attention q/k/v/o, and the MLP's gate/up/down on
dense models); embeddings, ``lm_head``, DoRA, biases and ``modules_to_save`` are refused,
each with a ValueError naming what the adapter asks for.

:func:`check_adapter` runs in the engine before a request is queued (config and tensor
shapes only, nothing loaded); :func:`load_adapter` reads the tensors in each worker.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass

CONFIG_FILE = "adapter_config.json"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")

# ...layers.{i}.<path>.{module}.lora_{A|B}.weight
_KEY_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:[\w.]+\.)?(\w+)\.lora_([AB])\.weight$")


@dataclass(frozen=True)
class AdapterSpec:
    """A checked adapter: rank, scale and which modules of which layers it adapts.

    Attributes:
        path: the adapter directory.
        rank: ``r``.
        scale: the factor folded into B (see the module doc).
        modules: PEFT module names it adapts (``q_proj``, ``gate_up_proj``, ...).
        weight_file: the tensors' file inside ``path``.
    """

    path: str
    rank: int
    scale: float
    modules: frozenset[str]
    weight_file: str


def module_shapes(hf_config) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of every PEFT module name a Llama-like decoder layer
    has, from the Hugging Face config (``head_dim`` defaults to hidden / heads)."""
    hidden = hf_config.hidden_size
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    head_dim = getattr(hf_config, "head_dim", None) or hidden // heads
    q, kv = heads * head_dim, kv_heads * head_dim
    inter = getattr(hf_config, "intermediate_size", None) or 0
    return {
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "qkv_proj": (hidden, q + 2 * kv),
        "o_proj": (q, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "gate_up_proj": (hidden, 2 * inter),
        "down_proj": (inter, hidden),
    }


def _read_config(path: str) -> dict:
    file = os.path.join(path, CONFIG_FILE)
    if not os.path.isdir(path):
        raise ValueError(f"LoRA adapter path {path!r} is not a directory.")
    if not os.path.isfile(file):
        raise ValueError(f"LoRA adapter {path!r} has no {CONFIG_FILE} (a PEFT adapter directory).")
    try:
        with open(file) as f:
            cfg = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"LoRA adapter {path!r}: cannot read {CONFIG_FILE}: {e}") from e
    if not isinstance(cfg, dict):
        raise ValueError(f"LoRA adapter {path!r}: {CONFIG_FILE} is not a JSON object.")
    return cfg


def _refuse_unsupported(path: str, cfg: dict) -> None:
    peft_type = cfg.get("peft_type", "LORA")
    if str(peft_type).upper() != "LORA":
        raise ValueError(f"LoRA adapter {path!r}: peft_type={peft_type!r}, only LORA is served.")
    for key, off in (("use_dora", False), ("fan_in_fan_out", False), ("lora_bias", False)):
        if cfg.get(key, off):
            raise ValueError(f"LoRA adapter {path!r}: {key}=true is not supported.")
    if cfg.get("bias", "none") != "none":
        raise ValueError(
            f"LoRA adapter {path!r}: bias={cfg['bias']!r} is not supported (only 'none')."
        )
    if cfg.get("modules_to_save"):
        raise ValueError(
            f"LoRA adapter {path!r}: modules_to_save={cfg['modules_to_save']!r} is not "
            "supported (full copies of base modules)."
        )
    for key in ("rank_pattern", "alpha_pattern"):
        if cfg.get(key):
            raise ValueError(
                f"LoRA adapter {path!r}: a per-module {key} is not supported; use one r and "
                "lora_alpha for every module."
            )


def _weight_shapes(path: str) -> tuple[str, dict[str, tuple[int, ...]]]:
    """(file name, {tensor name: shape}) of the adapter's weights, without loading them."""
    for name in WEIGHT_FILES:
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            continue
        try:  # a truncated or foreign file raises the reader's own error type
            if name.endswith(".safetensors"):
                from safetensors import safe_open

                with safe_open(file, framework="pt") as f:
                    return name, {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
            import torch

            state = torch.load(file, map_location="cpu", weights_only=True)
            return name, {k: tuple(v.shape) for k, v in state.items()}
        except Exception as e:
            raise ValueError(
                f"LoRA adapter {path!r}: cannot read {name}: {type(e).__name__}: {e}"
            ) from e
    raise ValueError(f"LoRA adapter {path!r} has none of {list(WEIGHT_FILES)}.")


def _check_values(path: str, weight_file: str) -> None:
    """Read every tensor of the adapter (one at a time for safetensors) and refuse a
    non-floating dtype or a NaN / infinite value: the batched product adds every slot's
    columns times a 0/1 mask (vllm/lora/layers.py), so a non-finite slot would turn every
    token of a step into NaN, other adapters' and the base model's included."""
    import torch

    file = os.path.join(path, weight_file)

    def check(key: str, tensor: torch.Tensor) -> None:
        if not tensor.is_floating_point():
            raise ValueError(
                f"LoRA adapter {path!r}: tensor {key!r} has dtype {tensor.dtype}; LoRA "
                "weights must be floating point."
            )
        if not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"LoRA adapter {path!r}: tensor {key!r} holds NaN or infinite values.")

    if weight_file.endswith(".safetensors"):
        from safetensors import safe_open

        with safe_open(file, framework="pt") as f:
            for key in f.keys():
                check(key, f.get_tensor(key))
    else:
        for key, tensor in torch.load(file, map_location="cpu", weights_only=True).items():
            check(key, tensor)


def check_adapter(path: str, hf_config, supported: tuple[str, ...], max_rank: int,
                  values: bool = True) -> AdapterSpec:  # fmt: skip
    """Check the adapter at ``path`` against the model and the engine's limits.

    Args:
        path: the adapter directory; a leading ``~`` is the user's home, a relative path is
            taken from the current directory (the spec holds the absolute path).
        hf_config: the served model's Hugging Face config.
        supported: PEFT module names the model can adapt (its ``lora_target_modules``).
        max_rank: ``--max-lora-rank``.
        values: also read the tensors and check their dtypes and values (the engine's
            check does; the workers, reading an adapter the engine checked, skip it).
    Returns:
        The :class:`AdapterSpec`.
    Raises:
        ValueError: a missing or unreadable file, an unsupported PEFT feature, ``r`` above
            ``max_rank``, a tensor of a module or shape the model does not have, a lora_A
            without its lora_B or the reverse (each message names the adapter, the value
            and the limit); with ``values``, a tensor of a non-floating dtype or with a
            NaN or infinite value.
    """
    path = os.path.abspath(os.path.expanduser(path))  # "~/..." and relative, as upstream
    cfg = _read_config(path)
    _refuse_unsupported(path, cfg)
    rank, alpha = cfg.get("r"), cfg.get("lora_alpha", cfg.get("r"))
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"LoRA adapter {path!r}: r={rank!r} must be a positive integer.")
    if rank > max_rank:
        raise ValueError(
            f"LoRA adapter {path!r} has rank r={rank}, above max_lora_rank={max_rank}; start "
            f"the engine with --max-lora-rank {rank} or more."
        )
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise ValueError(f"LoRA adapter {path!r}: lora_alpha={alpha!r} must be a number.")
    scale = alpha / math.sqrt(rank) if cfg.get("use_rslora") else alpha / rank
    weight_file, shapes = _weight_shapes(path)
    expected = module_shapes(hf_config)
    layers = hf_config.num_hidden_layers
    modules: set[str] = set()
    halves: dict[tuple[int, str], str] = {}  # (layer, module) -> "A", "B" or "AB"
    for key, shape in sorted(shapes.items()):
        m = _KEY_RE.search(key)
        if m is None:
            raise ValueError(
                f"LoRA adapter {path!r}: tensor {key!r} is not a decoder layer's lora_A / "
                "lora_B weight; adapters of embeddings or lm_head are not supported."
            )
        layer, module, ab = int(m.group(1)), m.group(2), m.group(3)
        if module not in supported:
            raise ValueError(
                f"LoRA adapter {path!r}: module {module!r} is not supported for "
                f"{type(hf_config).__name__}; supported: {sorted(supported)}."
            )
        if layer >= layers:
            raise ValueError(
                f"LoRA adapter {path!r}: tensor {key!r} is for layer {layer}; the model has "
                f"{layers}."
            )
        fan_in, fan_out = expected[module]
        want = (rank, fan_in) if ab == "A" else (fan_out, rank)
        if shape != want:
            raise ValueError(
                f"LoRA adapter {path!r}: tensor {key!r} has shape {list(shape)}, expected "
                f"{list(want)} (r={rank}, {module} is {fan_in} -> {fan_out})."
            )
        modules.add(module)
        halves[(layer, module)] = halves.get((layer, module), "") + ab
    for (layer, module), got in sorted(halves.items()):
        if got != "AB":
            raise ValueError(
                f"LoRA adapter {path!r}: layer {layer} {module} has lora_{got} without its "
                "other half."
            )
    if not modules:
        raise ValueError(f"LoRA adapter {path!r} holds no lora_A / lora_B tensor.")
    if values:
        _check_values(path, weight_file)
    return AdapterSpec(path, rank, float(scale), frozenset(modules), weight_file)


def load_adapter(spec: AdapterSpec):
    """The adapter's tensors as ``{(layer, module): (A [r, in], B [out, r] * scale)}``,
    float32 on the CPU (one dict per adapter; the worker casts into its slots).

    Raises:
        ValueError: a layer with lora_A but not lora_B (or the reverse).
    """
    import torch

    file = os.path.join(spec.path, spec.weight_file)
    if spec.weight_file.endswith(".safetensors"):
        from safetensors.torch import load_file

        state = load_file(file)
    else:
        state = torch.load(file, map_location="cpu", weights_only=True)
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in state.items():
        m = _KEY_RE.search(key)
        halves.setdefault((int(m.group(1)), m.group(2)), {})[m.group(3)] = tensor.float()
    out = {}
    for (layer, module), ab in halves.items():
        if set(ab) != {"A", "B"}:
            raise ValueError(
                f"LoRA adapter {spec.path!r}: layer {layer} {module} has lora_{''.join(ab)} "
                "without its other half."
            )
        out[(layer, module)] = (ab["A"], ab["B"] * spec.scale)  # [r, in], [out, r]
    return out
