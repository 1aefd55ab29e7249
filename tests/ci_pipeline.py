"""Reading ``.buildkite/test-pipeline.yaml``: its command steps, the pytest marker expression
of each test step, and which steps select each collected test.

The last part matches collected tests against the steps: the running session's own items
when it collected the whole suite (``session_suite_items``, no second import of every test
module), else pytest's collection once more, in a subprocess, with the ``StepSelection``
plugin below; tests/test_ci_pipeline.py starts it as
``python -c "from tests.ci_pipeline import main; ..." STEPS_JSON OUT_JSON``.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = ROOT / ".buildkite" / "test-pipeline.yaml"


def load_pipeline(path: Path = PIPELINE) -> dict:
    """The pipeline file as a dict (YAML anchors resolved). Raises ValueError when the file
    has no ``steps`` list."""
    with open(path, encoding="utf-8") as f:
        pipeline = yaml.safe_load(f)
    if not isinstance(pipeline, dict) or not isinstance(pipeline.get("steps"), list):
        raise ValueError(f"{path}: expected a mapping with a 'steps' list")
    return pipeline


def command_steps(pipeline: dict) -> list[dict]:
    """The command steps (those with ``command`` or ``commands``), group steps flattened."""
    steps = []
    for step in pipeline["steps"]:
        if isinstance(step, dict) and "group" in step:
            steps.extend(command_steps({"steps": step.get("steps", [])}))
        elif isinstance(step, dict) and ("command" in step or "commands" in step):
            steps.append(step)
    return steps


def step_argv(step: dict) -> list[str]:
    """The shell words of a step's single command. Raises ValueError for a step with several
    commands: a test step is one pytest command."""
    command = step.get("command", step.get("commands"))
    if isinstance(command, list):
        if len(command) != 1:
            raise ValueError(f"step {step.get('key')!r}: expected one command, got {command!r}")
        command = command[0]
    return shlex.split(command)


def pytest_args(argv: list[str]) -> list[str] | None:
    """The words that reach pytest: those after ``pytest`` (``python -m pytest ...``) or after
    ``.ci/run`` (it passes its arguments to pytest); None when the command runs no tests."""
    for i, word in enumerate(argv):
        if word == "pytest" or word.endswith(".ci/run"):
            return argv[i + 1 :]
    return None


def runs_pytest(argv: list[str]) -> bool:
    """Whether the command runs the test suite: pytest itself or .ci/run."""
    return pytest_args(argv) is not None


def marker_expression(step: dict) -> str:
    """The ``-m`` expression of a test step. Raises ValueError unless there is exactly one."""
    args = pytest_args(step_argv(step)) or []
    found = [args[i + 1] for i, word in enumerate(args[:-1]) if word == "-m"]
    found += [word[2:] for word in args if word.startswith("-m") and len(word) > 2]
    if len(found) != 1:
        raise ValueError(
            f"step {step.get('key')!r}: expected exactly one -m expression, got {found!r}"
        )
    return found[0]


def marker_steps(pipeline: dict) -> dict[str, str]:
    """``{step key: -m expression}`` for every step that runs pytest. Raises ValueError for a
    test step without a key, a repeated key, or a step without exactly one ``-m``."""
    result: dict[str, str] = {}
    for step in command_steps(pipeline):
        if not runs_pytest(step_argv(step)):
            continue
        key = step.get("key")
        if not key or key in result:
            raise ValueError(f"test step {step.get('label')!r}: missing or repeated key {key!r}")
        result[key] = marker_expression(step)
    return result


def partition_problems(selected: dict[str, list[str]]) -> list[str]:
    """Problems with ``{test id: keys of the steps that select it}``: a test no step selects,
    or one that several steps select. Empty when every test is in exactly one step."""
    problems = []
    for test_id, keys in sorted(selected.items()):
        if not keys:
            problems.append(f"in no step: {test_id}")
        elif len(keys) > 1:
            problems.append(f"in steps {', '.join(sorted(keys))}: {test_id}")
    return problems


def suite_id(item) -> str:
    """The item's test id as plain pytest names it: under ``--dist loadgroup`` pytest-xdist
    appends "@<group>" to the ids of tests marked ``xdist_group(<group>)``."""
    test_id = item.nodeid
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        group = mark.args[0] if mark.args else mark.kwargs.get("name", "")
        test_id = test_id.removesuffix(f"@{group}")
    return test_id


def select_steps(items, expressions: dict[str, str]) -> dict[str, list[str]]:
    """``{test id: [keys of the steps whose -m expression selects it]}`` for collected
    pytest ``items``, matching markers exactly as ``pytest -m`` does."""
    from _pytest.mark import MarkMatcher
    from _pytest.mark.expression import Expression

    compiled = {key: Expression.compile(expr) for key, expr in expressions.items()}
    selected = {}
    for item in items:
        matcher = MarkMatcher.from_markers(item.iter_markers())
        selected[suite_id(item)] = [k for k, e in compiled.items() if e.evaluate(matcher)]
    return selected


# The running session's collected items, before any -m / -k / --deselect filtering: set by
# tests/conftest.py once it has added the ``multi_gpu_<n>`` markers.
SUITE_ITEMS = pytest.StashKey[list]()


def session_suite_items(config) -> list | None:
    """The items the running session collected when it collected the whole suite (its only
    argument is the ``tests`` folder, nothing ignored), else None: the caller then collects
    in a subprocess (``collect_selection``)."""
    items = config.stash.get(SUITE_ITEMS, None)
    args = [os.path.abspath(os.path.join(str(config.invocation_params.dir), a.split("::")[0]))
            for a in config.args]  # fmt: skip
    ignored = any(config.getoption(o, None) for o in ("ignore", "ignore_glob"))
    if items is None or ignored or args != [str(ROOT / "tests")]:
        return None
    return items


class StepSelection:
    """pytest plugin: once collection is done, write ``{test id: [step keys]}`` to a JSON
    file (``select_steps``; after tests/conftest.py has added ``multi_gpu_<n>``)."""

    def __init__(self, expressions: dict[str, str], out_path: str):
        self.expressions = expressions
        self.out_path = out_path

    def pytest_collection_finish(self, session):
        selected = select_steps(session.items, self.expressions)
        with open(self.out_path, "w", encoding="utf-8") as f:
            json.dump(selected, f, indent=1)


def collect_selection(expressions: dict[str, str], out_path: str) -> dict[str, list[str]]:
    """Collect the whole suite once in a subprocess and return ``{test id: [step keys]}``.
    Raises RuntimeError with pytest's output when the collection fails."""
    steps_json = str(out_path) + ".steps.json"
    with open(steps_json, "w", encoding="utf-8") as f:
        json.dump(expressions, f)
    code = "import sys; from tests.ci_pipeline import main; sys.exit(main(sys.argv[1:]))"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, steps_json, str(out_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0 or not os.path.exists(out_path):
        raise RuntimeError(
            f"collection failed (exit {proc.returncode}):\n"
            f"{proc.stdout[-4000:]}{proc.stderr[-4000:]}"
        )
    with open(out_path, encoding="utf-8") as f:
        return json.load(f)


def main(argv: list[str]) -> int:
    """``main([STEPS_JSON, OUT_JSON])``: collect ``tests`` (no -m) with ``StepSelection``."""
    import pytest

    steps_json, out_path = argv
    with open(steps_json, encoding="utf-8") as f:
        expressions = json.load(f)
    args = ["--collect-only", "-q", "-p", "no:cacheprovider", "tests"]
    return int(pytest.main(args, plugins=[StepSelection(expressions, out_path)]))
