"""The Buildkite pipeline (.buildkite/test-pipeline.yaml) runs every test exactly once.

Each test step is one pytest command with one ``-m`` expression; together they must
partition the suite: no test in two steps, none in no step. Each step also names its agent
queue, a timeout, the offline / cache environment, an agent-lost-only retry and its
artifacts. .ci/run validates the file against Buildkite's schema separately.
"""

import functools
import re
import shlex
import subprocess
import sys
from collections import Counter

import pytest

from tests.ci_pipeline import (
    ROOT,
    collect_selection,
    command_steps,
    load_pipeline,
    marker_expression,
    marker_steps,
    partition_problems,
    runs_pytest,
    select_steps,
    session_suite_items,
    step_argv,
    suite_id,
)

PIPELINE = load_pipeline()
STEPS = command_steps(PIPELINE)


def _option(argv: list[str], name: str) -> str | None:
    """The value after ``name`` in ``argv`` (``--gpus 2``) or after ``name=``, else None."""
    for i, word in enumerate(argv):
        if word == name and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(name + "="):
            return word[len(name) + 1 :]
    return None


def test_pipeline_has_test_and_benchmark_steps():
    keys = [step["key"] for step in STEPS]
    assert len(keys) == len(set(keys)), keys
    assert marker_steps(PIPELINE) == {
        "cpu": "not gpu and not multi_gpu",
        "gpu-1": "gpu and not multi_gpu",
        "gpu-2": "multi_gpu_2",
        "gpu-4": "multi_gpu_4",
    }
    assert {"bench-core", "bench-spec", "bench-serve", "bench-pp"} <= set(keys)


@pytest.mark.parametrize("step", STEPS, ids=lambda step: step["key"])
def test_step_agent_timeout_env_retry_artifacts(step):
    argv = step_argv(step)
    gpus = int(_option(argv, "--gpus") or 0)
    # The queue says how many GPUs the agent has; run-step.sh checks the same number.
    assert step["agents"] == {"queue": f"gpu-{gpus}" if gpus else "cpu"}
    assert isinstance(step["timeout_in_minutes"], int) and 0 < step["timeout_in_minutes"] <= 90

    env = {**PIPELINE.get("env", {}), **step.get("env", {})}
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"
    assert env["TRITON_CACHE_DIR"].startswith("/")
    if gpus:
        assert env["FLASHINFER_WORKSPACE_BASE"].startswith("/")

    # Retried when the agent is lost (-1) or stopped (255), never on a test failure.
    automatic = step["retry"]["automatic"]
    assert sorted(rule["exit_status"] for rule in automatic) == [-1, 255]
    assert all(set(rule) == {"exit_status", "limit"} for rule in automatic), automatic

    artifacts = step["artifact_paths"]
    if runs_pytest(argv):
        junit = _option(argv, "--junitxml")
        assert junit is not None and junit.startswith("artifacts/") and junit in artifacts
        assert ("--allow-no-tests" in argv) == (step["key"] == "gpu-4")
    else:
        out = _option(argv, "--out")
        assert argv[argv.index(".buildkite/run-step.sh") + 3] == "benchmarks/run_gpu_suite.sh"
        assert artifacts == [f"{out}/*"], artifacts


def test_marker_expressions_name_registered_markers(pytestconfig):
    registered = {
        line.split(":")[0].split("(")[0].strip() for line in pytestconfig.getini("markers")
    }
    for key, expr in marker_steps(PIPELINE).items():
        names = set(re.findall(r"[\w.+\-\[\]/:\\]+", expr)) - {"and", "or", "not"}
        assert names <= registered, f"step {key}: unregistered marker(s) {names - registered}"


def test_marker_expression_is_required_once():
    step = {"key": "s", "command": "python -m pytest tests -m gpu -m slow"}
    with pytest.raises(ValueError, match="exactly one -m"):
        marker_expression(step)
    with pytest.raises(ValueError, match="exactly one -m"):
        marker_steps({"steps": [{"key": "s", "command": "python -m pytest tests"}]})
    assert marker_expression({"key": "s", "command": 'bash .ci/run -m "not gpu"'}) == "not gpu"


def test_partition_problems_names_missing_and_doubled_tests():
    selected = {"t.py::a": ["cpu"], "t.py::b": [], "t.py::c": ["gpu-1", "gpu-2"]}
    assert partition_problems(selected) == [
        "in no step: t.py::b",
        "in steps gpu-1, gpu-2: t.py::c",
    ]
    assert partition_problems({"t.py::a": ["cpu"]}) == []


@pytest.mark.slow
def test_steps_partition_the_suite(tmp_path, request):
    """Matches each test's markers against every step's -m expression the way ``pytest -m``
    does, over the whole suite: the items this session collected when it runs the whole
    suite (CI), else a collection of its own (pytest in a subprocess)."""
    expressions = marker_steps(PIPELINE)
    items = session_suite_items(request.config)
    if items is not None:
        selected = select_steps(items, expressions)
    else:
        selected = collect_selection(expressions, str(tmp_path / "selection.json"))
    assert len(selected) > 100, f"only {len(selected)} tests collected"

    problems = partition_problems(selected)
    assert not problems, f"{len(problems)} test(s) not in exactly one step:\n" + "\n".join(
        problems[:40]
    )

    counts = Counter(keys[0] for keys in selected.values())
    for step in STEPS:
        if runs_pytest(step_argv(step)) and "--allow-no-tests" not in step_argv(step):
            assert counts[step["key"]] > 0, f"step {step['key']} selects no test"

    def steps_of(name: str) -> list[list[str]]:
        return [keys for test_id, keys in selected.items() if test_id.endswith(name)]

    assert steps_of("test_ci_pipeline.py::test_steps_partition_the_suite") == [["cpu"]]
    assert steps_of("::test_gpu_ray_pp2_smollm2_graphs") == [["gpu-2"]]
    graph_tests = [
        keys for test_id, keys in selected.items() if "test_cuda_graphs_gpu.py" in test_id
    ]
    assert graph_tests and all(keys == ["gpu-1"] for keys in graph_tests)


def test_contributing_gives_the_gpu_steps_commands():
    """docs/CONTRIBUTING.md's GPU-host commands are the GPU test steps' (less --junitxml)."""
    text = (ROOT / "docs" / "CONTRIBUTING.md").read_text(encoding="utf-8")
    documented = [
        shlex.split(line) for line in text.splitlines() if line.startswith(".buildkite/run-step.sh")
    ]
    gpu_test_steps = [s for s in STEPS if runs_pytest(step_argv(s)) and s["key"] != "cpu"]
    assert len(gpu_test_steps) == 3
    for step in gpu_test_steps:
        argv = [w for w in step_argv(step) if not w.startswith("--junitxml")]
        assert argv in documented, f"step {step['key']}: {shlex.join(argv)}"


def test_suite_id_drops_only_the_xdist_group_suffix():
    """Under ``--dist loadgroup`` a grouped test's id ends in "@<group>"; that suffix goes,
    an "@" of the test's own name stays, and ungrouped ids are unchanged."""

    class Item:
        def __init__(self, nodeid, group=None):
            self.nodeid = nodeid
            self.mark = pytest.mark.xdist_group(group).mark if group else None

        def get_closest_marker(self, name):
            return self.mark if name == "xdist_group" else None

    assert suite_id(Item("t.py::test_a@ray", "ray")) == "t.py::test_a"
    assert suite_id(Item("t.py::test_b[x@y]", "ray")) == "t.py::test_b[x@y]"
    assert suite_id(Item("t.py::test_b[x@y]@ray", "ray")) == "t.py::test_b[x@y]"
    assert suite_id(Item("t.py::test_c[x@ray]")) == "t.py::test_c[x@ray]"


def test_gpu_tests_run_forked():
    """Every gpu test is forked (conftest adds the marker), so none initialises CUDA in the
    pytest process: collecting gpu tests without it selects nothing, while they exist."""
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
           "tests/kernels", "tests/attention"]  # fmt: skip
    run = functools.partial(subprocess.run, capture_output=True, text=True, cwd=ROOT, timeout=300)
    unforked = run([*cmd, "-m", "(gpu or multi_gpu) and not forked"])
    assert unforked.returncode == 5, unforked.stdout[-2000:]  # 5: no test selected
    forked = run([*cmd, "-m", "gpu and forked"])
    assert forked.returncode == 0 and "test_cuda_kernels" in forked.stdout, forked.stdout[-2000:]
