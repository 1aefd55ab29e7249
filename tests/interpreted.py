"""A process that runs test cases under ``TRITON_INTERPRET=1`` (Triton's CPU interpreter),
each in a forked child: ``python -m tests.interpreted`` (:func:`tests.utils.run_interpreted`
starts one per pytest process and keeps it).

Why a separate process: the flag must be set before ``triton`` is first imported (its
``triton.language`` helpers are wrapped at that import), and the pytest process has
imported it compiled. Why a kept one that forks: a fresh interpreter per case spent seconds
importing torch, triton and the engine's kernels before the case began; here they are
imported once, and each case's test module once, before the fork.

Protocol, one JSON object per line: a request ``{"file": PATH, "case": NAME, "env": {...}}``
on stdin runs function NAME of the test file PATH in a child whose environment is ``env``
(plus the flag); the reply ``{"rc": EXIT_STATUS, "output": TEXT}`` on the original stdout
carries the child's exit status (non-zero when the case raised) and the end of its stdout
and stderr. End of input ends the process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
import traceback

OUTPUT_CHARS = 6000


def _load(path: str):
    """Import the test file ``path`` as a module of its own (not under ``tests.``)."""
    spec = importlib.util.spec_from_file_location(f"interpreted_{len(sys.modules)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_case(module, case: str, env: dict, out_fd: int) -> None:
    """The forked child: run ``module.case()`` with ``env``; never returns."""
    code = 0
    try:
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.environ.clear()
        os.environ.update(env)
        getattr(module, case)()
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        os._exit(code)


def serve(requests, replies) -> None:
    """Answer each request line of ``requests`` with a reply line on ``replies``."""
    import torch  # noqa: F401  (imported once, before the first fork)
    import triton  # noqa: F401

    modules: dict[str, object] = {}
    for line in requests:
        req = json.loads(line)
        env = {**req["env"], "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
        try:
            if req["file"] not in modules:
                modules[req["file"]] = _load(req["file"])
        except BaseException:
            reply = {"rc": 1, "output": traceback.format_exc()[-OUTPUT_CHARS:]}
        else:
            with tempfile.TemporaryFile() as out:
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _run_case(modules[req["file"]], req["case"], env, out.fileno())
                _, status = os.waitpid(pid, 0)
                out.seek(0)
                text = out.read().decode(errors="replace")
            reply = {"rc": os.waitstatus_to_exitcode(status), "output": text[-OUTPUT_CHARS:]}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def main() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("tests.interpreted needs TRITON_INTERPRET=1 in its environment")
    # replies go to the original stdout; anything else printed here goes to stderr
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    serve(sys.stdin, replies)


if __name__ == "__main__":
    main()
