"""``vllm bench NAME [flags]``: runs the script of ``benchmarks/`` that NAME names
(:data:`BENCHMARKS`; ``serve`` is ``benchmark_serving.py``, ``serving`` an alias) with
those flags, exactly as ``python benchmarks/benchmark_NAME.py [flags]`` would (the scripts
print their conditions and one JSON line each; ``--help`` lists their flags).

The scripts live next to the ``vllm`` package in a checkout (an editable install), not
inside it: this wrapper only finds and runs them.
"""

from __future__ import annotations

import os
import sys
import types

BENCHMARKS = {
    "latency": "benchmark_latency.py",
    "throughput": "benchmark_throughput.py",
    "serve": "benchmark_serving.py",  # upstream's name
}
ALIASES = {"serving": "serve"}  # this project's earlier name


def benchmarks_dir() -> str:
    """The ``benchmarks/`` directory beside the ``vllm`` package."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(os.path.dirname(package), "benchmarks")


def run_benchmark(name: str, argv: list[str]) -> int:
    """Run benchmark ``name`` ("latency", "throughput", "serve" or its alias "serving")
    with ``argv``.

    Returns:
        0 when the script finished, 2 when it is missing; a script's own ``SystemExit``
        status (argparse errors, ``--help``) passes through.
    """
    script = os.path.join(benchmarks_dir(), BENCHMARKS[ALIASES.get(name, name)])
    if not os.path.isfile(script):
        sys.stderr.write(
            f"error: `vllm bench {name}` runs {script}, which does not exist: it needs a "
            "source checkout installed with `pip install -e .`.\n"
        )
        return 2
    saved_argv, saved_path, saved_main = sys.argv, list(sys.path), sys.modules["__main__"]
    sys.argv = [f"vllm bench {name}", *argv]  # argparse's prog: the command typed
    sys.path.insert(0, os.path.dirname(script))  # the scripts import bench_common by name
    # As runpy.run_path, but keeping sys.argv[0] (run_path sets it to the script's path).
    main = types.ModuleType("__main__")
    main.__file__ = script
    sys.modules["__main__"] = main
    try:
        with open(script, encoding="utf-8") as f:
            code = compile(f.read(), script, "exec")
        exec(code, main.__dict__)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        sys.modules["__main__"] = saved_main
    return 0
