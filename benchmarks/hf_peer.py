"""The transformers peer of the throughput benchmark: ``generate()`` on the same model,
dtype, device and prompts, so the engine's tokens/s has a reference next to it.

Loading: an HF directory with weights via ``from_pretrained``; a ``.gguf`` file dequantized
by transformers (``GgufConfig(dequantize=True)``); ``load_format="dummy"`` (a config-only
directory such as ``benchmarks/configs/qwen2.5-0.5b``) via ``from_config`` with random
weights (speed does not depend on the values).

Generation: batches of up to ``batch_size`` prompts, left-padded, greedy, exactly
``max(output_len in the batch)`` new tokens (``min_new_tokens = max_new_tokens``, so EOS
never ends a row early). Only the tokens the engine was asked for (each request's own
output_len) are counted as output; with unequal lengths in a batch the extra tokens
transformers computes are its padding overhead.
"""

from __future__ import annotations

import os
import time
from typing import Any

from tqdm.auto import tqdm


def load_hf_model(model: str, dtype: Any, device: str, load_format: str = "auto") -> Any:
    """A transformers causal LM in eval mode on ``device``.

    Args:
        model: HF directory or .gguf file (the engine's ``--model``).
        dtype: a torch.dtype (use the engine's resolved dtype).
        device: "cuda" or "cpu".
        load_format: "dummy" builds the model from config.json with random weights.
    Raises:
        ValueError: a directory without config.json.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if load_format == "dummy":
        if not os.path.isfile(os.path.join(model, "config.json")):
            raise ValueError(f"load_format='dummy' needs a directory with config.json: {model!r}")
        config = AutoConfig.from_pretrained(model)
        torch.manual_seed(0)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # works on transformers versions with or without dtype=
        try:
            with torch.device(device):
                hf = AutoModelForCausalLM.from_config(config)
        finally:
            torch.set_default_dtype(previous)
    elif model.endswith(".gguf"):
        from transformers import GgufConfig

        folder, name = os.path.dirname(os.path.abspath(model)), os.path.basename(model)
        hf = AutoModelForCausalLM.from_pretrained(
            folder,
            gguf_file=name,
            quantization_config=GgufConfig(gguf_file=name, dequantize=True),
            dtype=dtype,
        )
    else:
        hf = AutoModelForCausalLM.from_pretrained(model, dtype=dtype)
    # .to(dtype) too: older transformers read ``torch_dtype=`` and ignore ``dtype=``.
    return hf.to(device=device, dtype=dtype).eval()


def _left_pad(rows: list[list[int]], pad_id: int, device: str):
    """(input_ids, attention_mask), both ``[batch, max_len]`` int64, padding on the left."""
    import torch

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # [B, L]
    mask = torch.zeros((len(rows), width), dtype=torch.long)  # [B, L]
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r) :] = 1
    return ids.to(device), mask.to(device)


def _pad_id(hf: Any) -> int:
    """pad_token_id, else the (first) eos_token_id, else 0; always inside the vocabulary
    (padded positions are masked, so the value only has to be a valid embedding row)."""
    cfg = hf.config
    vocab = getattr(cfg, "vocab_size", None) or 1
    for v in (getattr(cfg, "pad_token_id", None), getattr(cfg, "eos_token_id", None)):
        v = v[0] if isinstance(v, list) and v else v
        if isinstance(v, int) and 0 <= v < vocab:
            return v
    return 0


def hf_generate(
    hf: Any,
    prompts: list[list[int]],
    output_lens: list[int],
    batch_size: int,
    device: str,
    show_progress: bool = True,
) -> dict[str, float]:
    """Run greedy ``generate()`` over ``prompts`` in batches and time it.

    Args:
        prompts: token-id lists.
        output_lens: new tokens wanted per prompt (same order).
        batch_size: prompts per ``generate()`` call (> 0).
    Returns:
        ``{"elapsed_s", "output_tokens", "output_tokens_per_s", "total_tokens_per_s"}``;
        output_tokens = sum(output_lens), elapsed excludes one warm-up call.
    Raises:
        ValueError: batch_size < 1 or mismatched lengths.
    """
    import torch

    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    if len(prompts) != len(output_lens):
        raise ValueError(f"{len(prompts)} prompts but {len(output_lens)} output lengths.")
    pad = _pad_id(hf)

    def run(rows: list[list[int]], new: int) -> None:
        ids, mask = _left_pad(rows, pad, device)
        hf.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=new,
            min_new_tokens=new,
            pad_token_id=pad,
            temperature=None,
            top_p=None,
            top_k=None,
        )

    with torch.inference_mode():
        run([prompts[0][:8] or [pad]], 2)  # warm-up: kernels, allocator
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        starts = range(0, len(prompts), batch_size)
        for s in tqdm(starts, desc="transformers generate", disable=not show_progress):
            run(prompts[s : s + batch_size], max(output_lens[s : s + batch_size]))
        if device == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
    out_tokens = sum(output_lens)
    in_tokens = sum(len(p) for p in prompts)
    return {
        "elapsed_s": elapsed,
        "output_tokens": out_tokens,
        "output_tokens_per_s": out_tokens / elapsed,
        "total_tokens_per_s": (out_tokens + in_tokens) / elapsed,
    }
