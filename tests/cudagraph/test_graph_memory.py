"""The graph-memory estimate (vllm/cudagraph/memory.py) on CPU: the production trial capture
and extrapolation, with device memory counted by fakes (FlashInfer wrappers and the graph
pool), checked against what the real capture then takes.

Regression guards:
- a trial probe (largest / smallest size) that missed the per-size FlashInfer wrapper
  workspaces (on an H200: 0.079 GiB estimated against 0.363 GiB captured);
- an estimate below the capture with several virtual engines (on a GPU with two VEs:
  "graphs (estimated) 0.081 GiB", then "Captured 32 CUDA graphs ... using 0.107 GiB").
"""

import pytest
import torch

from tests.cudagraph.test_graph_capture import make_worker
from tests.worker.fakes import FakeCapturer, FakeDecodeWrapper

MIB = 2**20


def test_graph_memory_extrapolation_with_a_prefill_graph():
    """The trial trace: state buffers, then the largest prefill graph (its pool), then the
    two largest decode sizes. One VE = memory after the largest decode graph + the second
    graph's increment per further decode graph (+ the other prefill graphs' outputs); every
    VE counts as a whole one."""
    from vllm.cudagraph.memory import extrapolate

    trace = [("state", 2 * MIB, 2 * MIB), ("prefill-512", 40 * MIB, 3 * MIB),
             (256, 50 * MIB, 4 * MIB), (248, 51 * MIB, 4 * MIB)]  # fmt: skip
    # 36 decode graphs on one VE: 50 + 35 x 1 MiB
    assert extrapolate(trace, 36, 1) == 85 * MIB
    # two VEs: each its own buffers, pool and 36 graphs
    assert extrapolate(trace, 36, 2) == 2 * 85 * MIB
    # the outputs of the prefill graphs the trial did not capture, per VE
    assert extrapolate(trace, 36, 2, 3 * MIB) == 2 * 88 * MIB
    # without a prefill graph the same rule holds
    assert extrapolate([trace[0], *trace[2:]], 36, 1) == 85 * MIB
    # the largest decode-loop graph grows the pool by its logits: 7 MiB more per VE
    loop = [*trace, ("loop-64", 58 * MIB, 12 * MIB)]
    assert extrapolate(loop, 36, 2) == 2 * (85 + 7) * MIB


def test_a_further_graph_costs_its_share_of_an_allocator_segment():
    """Two probes whose wrappers share one 20 MiB segment: the second's reserved increment
    is 0, but it holds 8 MiB more live memory, and a segment holds two such blocks, so each
    further graph is charged 10 MiB."""
    from vllm.cudagraph.memory import extrapolate, segment_cost

    assert segment_cost(8 * MIB) == 10 * MIB
    assert segment_cost(12 * MIB) == 12 * MIB  # its own segment, 2 MiB-rounded
    assert segment_cost(int(12.5 * MIB)) == 14 * MIB
    assert segment_cost(4 * 1024) == 4 * 1024 and segment_cost(0) == 0
    trace = [("state", 2 * MIB, 2 * MIB), (256, 22 * MIB, 10 * MIB), (248, 22 * MIB, 18 * MIB)]
    assert extrapolate(trace, 35, 1) == 22 * MIB + 34 * 10 * MIB


class _Memory:
    """Device memory as the fakes count it: bytes reserved, live bytes, and per VE (keyed by
    its KV cache) the temporaries its graphs' pool already holds. Blocks of 1-10 MiB are
    packed into 20 MiB segments as PyTorch's CUDA caching allocator does."""

    def __init__(self):
        self.reserved = 0
        self.allocated = 0
        self.segment_free = 0
        self.capturing = False
        self.held: dict[int, int] = {}

    def alloc(self, nbytes: int) -> None:
        """A live block of ``nbytes`` (1-10 MiB): into the open segment if it fits."""
        self.allocated += nbytes
        if nbytes > self.segment_free:
            self.reserved += 20 * MIB
            self.segment_free = 20 * MIB
        self.segment_free -= nbytes

    def empty_cache(self) -> None:
        """What torch.cuda.empty_cache does to the open segment's free part."""
        self.segment_free = 0


class _CountingCapturer(FakeCapturer):
    """FakeCapturer that reports :class:`_Memory` and marks when a capture runs."""

    def __init__(self, memory: _Memory):
        super().__init__()
        self.memory = memory

    def capture(self, fn, pool):
        self.memory.capturing = True
        try:
            return super().capture(fn, pool)
        finally:
            self.memory.capturing = False

    def memory_reserved(self, device) -> int:
        return self.memory.reserved

    def memory_allocated(self, device) -> int:
        return self.memory.allocated


class _StubModel:
    """The model's attributes, but a call returns zeros [tokens, hidden]: no kernel runs.
    With ``memory``, a captured call takes ``token_bytes`` of temporaries per token from its
    VE's share of the pool, which grows when they do not fit."""

    def __init__(self, model, hidden, memory: _Memory | None = None, token_bytes: int = 0):
        self._model, self._hidden = model, hidden
        self._memory, self._token_bytes = memory, token_bytes

    def __getattr__(self, name):
        return getattr(self._model, name)

    def __call__(self, ids, positions=None, kv_caches=None, *args):
        m = self._memory
        if m is not None and m.capturing:
            key, need = id(kv_caches[0]), ids.shape[0] * self._token_bytes
            m.reserved += max(0, need - m.held.get(key, 0))
            m.held[key] = max(need, m.held.get(key, 0))
        return torch.zeros(ids.shape[0], self._hidden)


def _stub_worker(tiny_llama_dir, monkeypatch, memory, token_bytes=0, num_ves=1, **kw):
    """make_worker (FLASHINFER, fake wrappers that hold 8 MiB each, no capture) whose
    model is a :class:`_StubModel`: only the attention metadata built per size and the
    pool are under test, and the small path's kernel needs a GPU."""
    import vllm.model_executor.model_loader as loader

    real_get_model = loader.get_model

    def get_model(model_config, *a, **k):
        model = real_get_model(model_config, *a, **k)
        return _StubModel(model, model_config.hf_config.hidden_size, memory, token_bytes)

    monkeypatch.setattr(loader, "get_model", get_model)
    wrapper_init = FakeDecodeWrapper.__init__

    def init(self, *a, **k):
        wrapper_init(self, *a, **k)
        memory.alloc(8 * MIB)

    monkeypatch.setattr(FakeDecodeWrapper, "__init__", init)
    w = make_worker(tiny_llama_dir, num_ves, backend="FLASHINFER", capture=False, **kw)
    w.model_runner.use_cuda_graph = True  # estimate_graph_memory measures on CUDA only
    return w


@pytest.mark.forked
def test_graph_memory_estimate_covers_per_size_wrappers(tiny_llama_dir, monkeypatch):
    """FLASHINFER builds one decode wrapper per captured size above the small path's rows,
    each with its own int workspace (8 MiB in FlashInfer). With device memory counted as
    those workspaces, the estimate taken before the KV cache (a trial of the two largest
    sizes, extrapolated) covers what the full capture then takes, and exceeds it by at
    most one segment plus the prefill graphs' outputs. The allocator packs two workspaces
    per 20 MiB segment, so the second probe's reserved increment is 0 (on an H200: 0.085
    GiB estimated against 0.390 GiB captured): its live bytes must count."""
    memory = _Memory()
    w = _stub_worker(tiny_llama_dir, monkeypatch, memory, small_rows=1, max_num_seqs=16)
    mr = w.model_runner
    assert mr.capture_sizes.sizes == (1, 2, 4, 8, 16)
    estimate = mr.estimate_graph_memory(1, _CountingCapturer(memory))
    memory.empty_cache()
    w.capture_graphs(_CountingCapturer(memory))
    captured = mr.graph_runner.capture_bytes
    assert captured == 2 * 20 * MIB  # wrappers of sizes 2, 4, 8, 16: two per segment
    assert captured <= estimate <= captured + 20 * MIB + MIB, (estimate / MIB, captured / MIB)


@pytest.mark.forked
@pytest.mark.parametrize("num_ves", [1, 2, 3])
def test_graph_memory_estimate_covers_every_virtual_engine(tiny_llama_dir, monkeypatch, num_ves):
    """Guards an estimate below the capture with several virtual engines (seen on a GPU
    with two VEs: "graphs (estimated) 0.081 GiB", then "Captured 32 CUDA graphs ... 2
    virtual engines ... using 0.107 GiB"). Counting the pool of the largest graphs once
    and a further VE as its buffers plus its graphs' increments assumes that VE reuses
    the pool; here it does not: each VE's captures take their temporaries (64 KiB per
    token, the largest prefill first) from a share of the pool of their own, and every
    size has a FlashInfer wrapper (8 MiB, two per 20 MiB allocator segment). The estimate
    must still cover the capture, and exceed it by no more than half a segment and the
    prefill graphs' outputs (under 1 MiB) per VE. Counting
    the pool once, it fell short for 2 and 3 VEs (113 MiB against 144 for 2 VEs)."""
    memory = _Memory()
    w = _stub_worker(tiny_llama_dir, monkeypatch, memory, token_bytes=64 * 1024,
                     num_ves=num_ves, small_rows=0, max_num_seqs=16)  # fmt: skip
    mr = w.model_runner
    assert mr.capture_sizes.sizes == (1, 2, 4, 8, 16) and mr.graph_spec.prefill_sizes
    estimate = mr.estimate_graph_memory(num_ves, _CountingCapturer(memory))
    memory.empty_cache()
    w.capture_graphs(_CountingCapturer(memory))
    captured = mr.graph_runner.capture_bytes
    pool = mr.graph_spec.prefill_sizes[-1] * 64 * 1024  # the largest prefill's temporaries
    segments = -(-5 * num_ves // 2)  # the wrappers, two per 20 MiB segment
    assert captured == segments * 20 * MIB + num_ves * pool, captured
    slack = num_ves * (10 * MIB + MIB)  # a half-used segment per VE, prefill outputs
    assert captured <= estimate <= captured + slack, (estimate / MIB, captured / MIB)
