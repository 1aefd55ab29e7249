"""FLASHINFER's background module builds (vllm/attention/backends/flashinfer/prebuild.py):
what is planned (every wrapper kind and window, with the backend's own plan arguments, so
the same modules are built), that the backend waits for them before it plans anything of its
own, and that a failed build leaves the engine's own path to raise."""

import threading

import pytest
import torch

from vllm.attention.backends.abstract import AttentionSpec
from vllm.attention.backends.flashinfer import FlashInferBackend

HEAD = 32


def _spec(**kw) -> AttentionSpec:
    return AttentionSpec(4, 2, HEAD, 16, torch.float16, torch.device("cpu"), **kw)


def _recording(calls: list, gate: threading.Event | None = None, fail: bool = False):
    """Fake (prefill, decode) wrapper classes that record each plan's arguments."""

    class Prefill:
        def __init__(self, workspace, layout):
            assert layout == "NHD" and workspace.dtype == torch.uint8

        def plan(self, qo, indptr, indices, last, head_dim_qk, causal, **kw):
            if gate is not None:
                assert gate.wait(timeout=60), "the test never opened the gate"
            if fail:
                raise RuntimeError("nvcc exited with status 1")
            calls.append(("prefill", qo.tolist(), indptr.tolist(), last.tolist(), head_dim_qk, kw))

    class Decode:
        def __init__(self, workspace, layout, use_tensor_cores=False):
            self.tensor_cores = use_tensor_cores

        def plan(self, indptr, indices, last, head_dim, **kw):
            calls.append(("decode", self.tensor_cores, indptr.tolist(), head_dim, kw))

    return Prefill, Decode


def test_plans_every_kind_and_window_with_the_backends_arguments():
    """A model with two sliding windows: one prefill and one decode plan per window and for
    full attention, each with exactly the kwargs the backend plans its steps with."""
    calls: list = []
    backend = FlashInferBackend(_spec(sliding_windows=(8, 4)), *_recording(calls), prebuild=True)
    backend.wait_prebuild()
    assert backend.prebuild.errors == []
    prefill = [c for c in calls if c[0] == "prefill"]
    decode = [c for c in calls if c[0] == "decode"]
    windows = [None, *backend.windows]
    assert [c[5] for c in prefill] == [backend.plan_kwargs(w) for w in windows]
    assert [c[4] for c in decode] == [backend.plan_kwargs(w) for w in windows]
    assert [c[5]["window_left"] for c in prefill] == [-1, 7, 3]
    for _, qo, indptr, last, head, _ in prefill:  # one row of one token in one page
        assert (qo, indptr, last, head) == ([0, 1], [0, 1], [1], HEAD)
    # 4 query heads over 2 KV heads: a GQA group of 2, CUDA-core decode kernels
    assert all(c[1] is False and c[2] == [0, 1] and c[3] == HEAD for c in decode)


ENTRY_POINTS = {
    "eager wrappers": lambda b: b._eager_wrappers(),
    "windowed wrappers": lambda b: b._all_eager_wrappers(),
    "graph state": lambda b: b.make_graph_state(0),
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_backend_waits_for_the_builds_before_its_own_wrappers(entry):
    """While a build is running (here: blocked), every way the backend creates wrappers
    of its own waits; once the build ends it goes on."""
    calls: list = []
    gate = threading.Event()
    backend = FlashInferBackend(_spec(), *_recording(calls, gate), prebuild=True)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (ENTRY_POINTS[entry](backend), done.set()))
    worker.start()
    assert not done.wait(timeout=0.3), "wrappers were created during a build"
    assert backend._prefill is None and backend._windowed is None
    gate.set()
    worker.join(timeout=60)
    assert done.is_set()
    assert [c[0] for c in calls].count("prefill") == 1


def test_a_second_backend_waits_for_the_first_ones_builds():
    """Two backends in one process (a speculative draft next to its target) may plan the
    same modules: the second one's wait also covers the first one's running build."""
    gate = threading.Event()
    first = FlashInferBackend(_spec(), *_recording([], gate), prebuild=True)
    second = FlashInferBackend(_spec(), *_recording([]), prebuild=True)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (second._eager_wrappers(), done.set()))
    worker.start()
    assert not done.wait(timeout=0.3), "the second backend planned during the first's build"
    gate.set()
    worker.join(timeout=60)
    assert done.is_set() and first.prebuild.errors == []


def test_tensor_core_decode_builds_on_the_prefill_thread():
    """Tensor-core decode (a GQA group of 3) plans FlashInfer's prefill module, maybe the
    prefill wrapper's own: both kinds are planned one after the other on one thread."""
    calls: list = []
    spec = AttentionSpec(6, 2, HEAD, 16, torch.float16, torch.device("cpu"))
    backend = FlashInferBackend(spec, *_recording(calls), prebuild=True)
    assert len(backend.prebuild._threads) == 1
    backend.wait_prebuild()
    assert [c[0] for c in calls] == ["prefill", "decode"] and calls[1][1] is True
    assert len(FlashInferBackend(_spec(), *_recording([]), prebuild=True).prebuild._threads) == 2


def test_failed_build_is_logged_and_the_engine_goes_on():
    calls: list = []
    backend = FlashInferBackend(_spec(), *_recording(calls, fail=True), prebuild=True)
    backend.wait_prebuild()
    errors = backend.prebuild.errors
    assert len(errors) == 1 and "nvcc exited" in str(errors[0])
    assert [c[0] for c in calls] == ["decode"]  # the decode build ran on its own thread
    backend._eager_wrappers()  # no error here: the first real plan raises it again


def test_off_by_default_on_cpu():
    calls: list = []
    assert FlashInferBackend(_spec(), *_recording(calls)).prebuild is None
    assert calls == []
