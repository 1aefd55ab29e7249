"""The CUDA-graph capture contract on CPU: production capture_model / dispatch code with only
the graph object and FlashInfer's wrapper classes replaced by fakes (tests/worker/fakes.py).

Regression guards:
- capture buffers shared across virtual engines (upstream: "The batch size should be fixed
  in cudagraph mode, the runtime batch size 8 mismatches the batch size set during
  initialization 1" at PP start-up with FlashInfer);
- a decode batch larger than the largest captured graph (upstream: ``KeyError: 40`` in
  ``graph_runners[virtual_engine][batch_size]`` under speculative decoding).
"""

import pytest
import torch

from tests.worker.fakes import (
    FakeCapturer,
    FakeDecodeWrapper,
    FakePrefillWrapper,
    reintroduce_shared_rebound_buffers,
)
from vllm.attention.backends.flashinfer import FlashInferBackend
from vllm.sampling_params import SamplingParams
from vllm.sequence import ExecuteModelRequest, SequenceData, SequenceGroupMetadata


def make_worker(model, num_ves=1, backend="TORCH_SDPA", capture=True, small_rows=0, **kw):
    """A CPU Worker whose graphs are fakes; FLASHINFER runs its production code with fake
    wrappers, and its Triton small-decode path only up to ``small_rows`` rows (the engine's
    ``small_decode_max_rows``; default 0: every decode goes through the FlashInfer
    wrappers; the kernel needs a GPU or TRITON_INTERPRET=1)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.worker.worker import Worker

    kw.setdefault("num_gpu_blocks_override", 64 * num_ves)
    cfg = EngineArgs(
        model=model, device="cpu", small_decode_max_rows=small_rows, **kw
    ).create_engine_config()
    cfg.num_virtual_engines_override = num_ves
    w = Worker(cfg)
    w.init_device()
    if backend == "FLASHINFER":
        from vllm.cudagraph import graph_spec

        mr = w.model_runner
        mr.attn_backend = FlashInferBackend(mr.attn_spec, FakePrefillWrapper, FakeDecodeWrapper)
        # the spec as a FLASHINFER runner computes it (its decode-loop sizes)
        mr.graph_spec = graph_spec(cfg, 1, True, mr.attn_backend.loop_max_rows())
    w.load_model()
    w.initialize_cache(w.determine_num_available_blocks())
    if capture:
        w.capture_graphs(FakeCapturer())
    return w


def decode_request(num_rows, ve=0, ctx=5, block_size=16, first_block=0):
    """A decode step of ``num_rows`` sequences with ``ctx`` tokens each, one block each."""
    params = SamplingParams(temperature=0, max_tokens=4)
    groups = []
    for i in range(num_rows):
        data = SequenceData([(7 * i + j) % 400 + 3 for j in range(ctx)])
        blocks = [
            first_block + i * (-(-ctx // block_size)) + b for b in range(-(-ctx // block_size))
        ]
        groups.append(SequenceGroupMetadata(f"r{i}", False, {i: data}, params, {i: blocks}))
    return ExecuteModelRequest(groups, virtual_engine=ve)


def multi_step_call(g, e, rows, ctx, params, steps, callback=None):
    """A prefill of ``rows`` sequences of ``ctx`` tokens on both workers, then one decode
    call of the multi-step worker ``g`` (``steps`` scheduler steps; lookahead blocks
    reserved; ``callback`` as its ``async_callback``) against ``steps`` one-token steps of
    the eager worker ``e``. Returns (tokens per row from the call, the same from ``e``,
    ``g``'s graph replay counts of the call)."""
    req = decode_request(rows, ctx=ctx)
    for m in req.seq_group_metadata_list:
        for sid, d in m.seq_data.items():  # lookahead blocks for steps - 1 more tokens
            while len(m.block_tables[sid]) * 16 < d.get_len() + steps - 1:
                m.block_tables[sid].append(40 + 3 * sid + len(m.block_tables[sid]))
        m.sampling_params = params
        m.is_prompt = True
    for w in (g, e):
        first = w.execute_model(req)
    for m, o in zip(req.seq_group_metadata_list, first.outputs):
        m.is_prompt = False
        for d in m.seq_data.values():
            d.append_token_id(o.samples[0].output_token, 0.0)
    before = g.model_runner.counters.snapshot()["graph"].get(0, {})
    req.async_callback = callback
    multi = g.execute_model(req)
    req.async_callback = None
    after = g.model_runner.counters.snapshot()["graph"][0]
    delta = {s: n - before.get(s, 0) for s, n in after.items() if n != before.get(s, 0)}
    got = [[s.output_token] + [t for t, _ in s.extra_tokens] for o in multi.outputs
           for s in o.samples]  # fmt: skip
    want = [[] for _ in range(rows)]
    for _ in range(steps):
        out = e.execute_model(req)
        for r, (m, o) in enumerate(zip(req.seq_group_metadata_list, out.outputs)):
            want[r].append(o.samples[0].output_token)
            for d in m.seq_data.values():
                d.append_token_id(o.samples[0].output_token, 0.0)
    return got, want, delta


@pytest.mark.forked
@pytest.mark.parametrize("num_ves", [2, 3, 4])
def test_capture_every_virtual_engine_flashinfer(tiny_llama_dir, num_ves):
    FakeDecodeWrapper.instances.clear()
    w = make_worker(tiny_llama_dir, num_ves, "FLASHINFER", max_num_seqs=8)
    gr = w.model_runner.graph_runner
    assert gr.max_batchsize_to_capture == 8
    for ve in range(num_ves):
        assert sorted(gr.graphs.graph_runners[ve]) == [1, 2, 4, 8]
        # each captured size keeps its own fixed batch size, on its own VE's buffers
        for size, cg in gr.graphs.graph_runners[ve].items():
            assert cg.attn_metadata.wrapper._fixed_batch_size == size
            assert (
                cg.attn_metadata.wrapper.last.data_ptr()
                == gr.graphs.attn_states[ve].paged_kv_last_page_len.data_ptr()
            )
    ptrs = {gr.graphs.attn_states[ve].paged_kv_indptr.data_ptr() for ve in range(num_ves)}
    assert len(ptrs) == num_ves, "virtual engines share graph buffers"
    # ...but one float workspace (split-KV scratch) serves every wrapper, eager included
    backend = w.model_runner.attn_backend
    shared = backend.workspace()
    assert all(
        cg.attn_metadata.wrapper.workspace is shared
        for ve in range(num_ves)
        for cg in gr.graphs.graph_runners[ve].values()
    )
    assert backend._eager_wrappers()[1].workspace is shared
    # every VE replays and agrees with the others (same inputs, separate caches)
    outs = []
    for ve in range(num_ves):
        out = w.execute_model(decode_request(3, ve))
        outs.append([s.output_token for g in out.outputs for s in g.samples])
    assert all(o == outs[0] for o in outs)
    snap = w.model_runner.counters.snapshot()
    assert snap["graph"] == {ve: {4: 1} for ve in range(num_ves)}


@pytest.mark.forked
def test_shared_rebound_buffers_reproduce_upstream_error(tiny_llama_dir, monkeypatch):
    """Reintroduce the upstream bug: one graph state shared by every VE whose full-size
    handles get rebound to each captured slice. Capturing VE 1 must then fail exactly as
    upstream did."""
    reintroduce_shared_rebound_buffers(monkeypatch)
    with pytest.raises(
        ValueError, match="The batch size should be fixed in cudagraph mode.*8.*initialization 1"
    ):
        make_worker(tiny_llama_dir, 2, "FLASHINFER", max_num_seqs=8)


@pytest.mark.forked
def test_use_captured_graph_gate(tiny_llama_dir):
    w = make_worker(
        tiny_llama_dir, 1, max_num_seqs=12, max_model_len=128, max_seq_len_to_capture=64
    )
    gr = w.model_runner.graph_runner
    assert sorted(gr.graphs.graph_runners[0]) == [1, 2, 4, 8, 12]
    limit, k = gr.max_seq_len_to_capture, 4
    assert limit == 64
    for b in range(1, 2 * gr.max_batchsize_to_capture + 1):
        for ctx in (limit - 1, limit, limit + 1, limit + k):
            expected = b <= 12 and ctx <= limit
            assert gr._use_captured_graph(0, b, ctx) is expected, (b, ctx)
    assert gr._use_captured_graph(1 if len(gr.graphs.graph_runners) > 1 else 0, 1, 1)


@pytest.mark.forked
def test_batches_beyond_the_maximum_run_eagerly(tiny_llama_dir, monkeypatch):
    w = make_worker(
        tiny_llama_dir,
        1,
        max_num_seqs=64,
        max_cudagraph_capture_size=16,
        num_gpu_blocks_override=128,
    )
    gr = w.model_runner.graph_runner
    assert gr.max_batchsize_to_capture == 16
    for b in (17, 24, 40):
        w.execute_model(decode_request(b))
    w.execute_model(decode_request(16))
    snap = w.model_runner.counters.snapshot()
    assert snap["eager"] == {0: {"too_big": 3}} and snap["graph"] == {0: {16: 1}}
    # upstream's old gate (batch_size <= 256) asks for graphs that were never captured
    from vllm.cudagraph.runner import GraphRunner

    monkeypatch.setattr(GraphRunner, "_use_captured_graph", lambda self, ve, b, n: b <= 256)
    with pytest.raises(KeyError, match="40"):
        w.execute_model(decode_request(40))


@pytest.mark.forked
def test_block_table_wider_than_graph_buffer_is_clipped(tiny_llama_dir):
    """Lookahead blocks at the capture limit (upstream "(513,) into (512,)") never crash."""
    w = make_worker(tiny_llama_dir, 1, max_num_seqs=4, max_model_len=128, max_seq_len_to_capture=32)
    req = decode_request(2, ctx=32)
    for g in req.seq_group_metadata_list:  # one lookahead block past the 2-block limit
        for sid in g.block_tables:
            g.block_tables[sid] = g.block_tables[sid] + [60]
    out = w.execute_model(req)
    assert len(out.outputs) == 2
    assert w.model_runner.counters.snapshot()["graph"] == {0: {2: 1}}


@pytest.mark.forked
@pytest.mark.parametrize("backend", ["TORCH_SDPA", "FLASHINFER"])
def test_replay_equals_eager(tiny_llama_dir, backend):
    """Graph (fake) replay vs eager on the same padded inputs: identical tokens; contexts
    that differ per lane and cross block boundaries after capture at length 1."""
    g = make_worker(tiny_llama_dir, 1, backend, max_num_seqs=8)
    e = make_worker(tiny_llama_dir, 1, backend, capture=False, max_num_seqs=8)
    e.model_runner.pad_eager_batches = True
    for rows, ctx in ((1, 3), (3, 17), (5, 33), (7, 16)):
        # prefill the caches identically, then decode
        req = decode_request(rows, ctx=ctx)
        for m in req.seq_group_metadata_list:
            m.is_prompt = True
        tok = []
        for w in (g, e):
            out = w.execute_model(req)
            tok.append([s.output_token for o in out.outputs for s in o.samples])
        assert tok[0] == tok[1]
        for m, t in zip(req.seq_group_metadata_list, tok[0]):
            m.is_prompt = False
            for d in m.seq_data.values():
                d.append_token_id(t, 0.0)
                for sid in m.block_tables:
                    need = -(-d.get_len() // 16)
                    while len(m.block_tables[sid]) < need:
                        m.block_tables[sid].append(50 + sid)
        outs = [w.execute_model(req) for w in (g, e)]
        ids = [[s.output_token for o in out.outputs for s in o.samples] for out in outs]
        assert ids[0] == ids[1], (rows, ctx)
        lp = [
            [s.logprobs[s.output_token].logprob for o in out.outputs for s in o.samples]
            for out in outs
        ]
        assert torch.allclose(torch.tensor(lp[0]), torch.tensor(lp[1]), atol=1e-5)
    snap_g = g.model_runner.counters.snapshot()
    assert snap_g["graph"] == {0: {1: 1, 4: 1, 8: 2}}
    assert e.model_runner.counters.snapshot()["graph"] == {}


def _tokens(out):
    return [(s.output_token, s.logprobs[s.output_token].logprob) for o in out.outputs
            for s in o.samples]  # fmt: skip


@pytest.mark.forked
@pytest.mark.parametrize("backend", ["TORCH_SDPA", "FLASHINFER"])
def test_prefill_graphs(tiny_llama_dir, backend):
    """One-sequence prefills replay the prefill graph of the next token count up (counted),
    each VE on its own buffers; they equal an eager run padded alike exactly and an
    unpadded eager run in tokens; the cache they write serves the next decode step as the
    unpadded run's does (padded tokens wrote only the scratch slot). Prompts over the
    largest size and prefills of two sequences run eagerly."""
    kw = dict(max_num_seqs=8, prefill_graph_max_tokens=64)
    g = make_worker(tiny_llama_dir, 2, backend, **kw)
    padded = make_worker(tiny_llama_dir, 2, backend, capture=False, **kw)
    padded.model_runner.pad_eager_batches = True
    plain = make_worker(tiny_llama_dir, 2, backend, capture=False, **kw)
    gr = g.model_runner.graph_runner
    assert g.model_runner.graph_spec.prefill_sizes == (16, 24, 32, 48, 64)
    assert all(gr.captured_sizes(ve, "prefill") == [16, 24, 32, 48, 64] for ve in (0, 1))
    assert all(sorted(gr.graphs.prefill_graphs[ve]) == [16, 24, 32, 48, 64] for ve in (0, 1))
    buffers = {id(gr.graphs.prefill_graphs[ve][16].attn_metadata.slot_mapping.untyped_storage())
               for ve in (0, 1)}  # fmt: skip
    assert len(buffers) == 2, "virtual engines share prefill graph buffers"
    cases = [(1, 3, 1), (1, 17, 0), (1, 40, 0), (1, 70, 0), (2, 5, 1)]
    for rows, ctx, ve in cases:
        req = decode_request(rows, ve=ve, ctx=ctx)
        for m in req.seq_group_metadata_list:
            m.is_prompt = True
        got, want, ref = (_tokens(w.execute_model(req)) for w in (g, padded, plain))
        assert got == want, (rows, ctx)  # same kernels, same shapes: bit-exact
        assert [t for t, _ in got] == [t for t, _ in ref], (rows, ctx)
        assert torch.allclose(torch.tensor(got)[:, 1], torch.tensor(ref)[:, 1], atol=1e-4)
        for m, (t, _) in zip(req.seq_group_metadata_list, got):
            m.is_prompt = False
            for d in m.seq_data.values():
                d.append_token_id(t, 0.0)
        nxt = [_tokens(w.execute_model(req)) for w in (g, plain)]
        assert [t for t, _ in nxt[0]] == [t for t, _ in nxt[1]], (rows, ctx)
    snap = g.model_runner.counters.snapshot()
    assert snap["prefill_graph"] == {0: {24: 1, 48: 1}, 1: {16: 1}}, snap
    assert snap["eager"] == {0: {"prefill": 1}, 1: {"prefill": 1}}, snap
    assert padded.model_runner.counters.snapshot()["prefill_graph"] == {}
    if backend == "FLASHINFER":  # only the two eager prefills planned FlashInfer's wrapper
        be = g.model_runner.attn_backend  # graph prefills: 2 VEs x 5 captures + 3 replays
        assert be.graph_prefill_runs == 2 * 5 + 3 and be.prefill_runs == 2, (
            be.graph_prefill_runs, be.prefill_runs)  # fmt: skip


@pytest.mark.forked
def test_plan_with_and_without_graphs(tiny_llama_dir):
    """One planner whether graphs exist or not: before capture every step is eager
    ("enforce_eager" for decode, "prefill"), padded like a graph only under the eager debug
    switch; after capture a step replays exactly when its padded size was captured and its
    context fits, else it names why it runs eagerly."""
    from vllm.attention.backends.abstract import ForwardMode
    from vllm.cudagraph import Plan

    kw = dict(max_num_seqs=8, prefill_graph_max_tokens=64, max_model_len=128,
              max_seq_len_to_capture=64)  # fmt: skip
    dec, pre = ForwardMode.DECODE, ForwardMode.PREFILL
    eager = make_worker(tiny_llama_dir, 1, capture=False, **kw).model_runner.graph_runner
    assert eager.captured_sizes(0) == []
    assert eager.plan(0, dec, 3, 3, 10) == Plan(0, None, "enforce_eager")
    assert eager.plan(0, dec, 3, 3, 10, pad_eager=True) == Plan(4, None, "enforce_eager")
    assert eager.plan(0, dec, 9, 9, 10, pad_eager=True) == Plan(0, None, "enforce_eager")
    assert eager.plan(0, pre, 1, 17) == Plan(0, None, "prefill")
    assert eager.plan(0, pre, 1, 17, pad_eager=True) == Plan(24, None, "prefill")
    assert eager.plan(0, pre, 2, 17, pad_eager=True) == Plan(0, None, "prefill")
    graphs = make_worker(tiny_llama_dir, 1, **kw).model_runner.graph_runner
    assert graphs.captured_sizes(0) == [1, 2, 4, 8]
    assert graphs.plan(0, dec, 3, 3, 64) == Plan(4, 4, None)
    assert graphs.plan(0, dec, 8, 8, 10, pad_eager=True) == Plan(8, 8, None)
    assert graphs.plan(0, dec, 9, 9, 10) == Plan(0, None, "too_big")
    assert graphs.plan(0, dec, 3, 3, 65) == Plan(0, None, "too_long")
    assert graphs.plan(0, pre, 1, 17) == Plan(24, 24, None)
    assert graphs.plan(0, pre, 1, 65) == Plan(0, None, "prefill")
    assert graphs.plan(0, pre, 2, 17) == Plan(0, None, "prefill")
