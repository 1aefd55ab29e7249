"""The CUDA worker on a real GPU: FlashInfer and TORCH_SDPA, real CUDA graphs per virtual
engine, memory profiling (marked ``gpu``; skipped without CUDA).

Comparisons (docs/design.md): vs transformers in bf16 -> check_logprobs_close; graphs vs
--enforce-eager with the same backend, dtype and batch composition -> exact.
"""

import os

import pytest

from tests.utils import (
    SMOLLM2_PROMPTS,
    check_logprobs_close,
    check_outputs_equal,
    hf_greedy,
    virtual_engines_override,
    vllm_greedy,
)

pytestmark = pytest.mark.gpu

PROMPTS = SMOLLM2_PROMPTS


def _llm(model, backend, **kw):
    os.environ["VLLM_ATTENTION_BACKEND"] = backend
    from vllm import LLM

    kw.setdefault("device", "cuda")
    kw.setdefault("dtype", "bfloat16")
    kw.setdefault("gpu_memory_utilization", 0.3)
    llm = LLM(model=model, **kw)
    # start-up (memory profiling, capture) builds metadata too: _assert_backend_ran counts
    # the runs after it
    llm.runs_at_start = _backend_runs(llm)
    return llm


_RUNS = ("prefill_runs", "decode_runs", "small_decode_runs", "graph_prefill_runs")


def _backend_runs(llm) -> dict[str, int]:
    """The attention backend's run counters (FLASHINFER; 0 for a backend without them)."""
    be = llm.llm_engine.executor.worker.model_runner.attn_backend
    return {k: getattr(be, k, 0) for k in _RUNS}


def _runs_since_start(llm) -> dict[str, int]:
    """The backend's run counters since ``_llm`` returned (start-up's runs left out)."""
    now = _backend_runs(llm)
    return {k: now[k] - llm.runs_at_start[k] for k in _RUNS}


def _counters(llm):
    return llm.llm_engine.decode_step_counters()


def _backend(backend):
    """("FLASHINFER" or "TORCH_SDPA", small path on, engine kwargs): "FLASHINFER-small" is
    FLASHINFER with its Triton small-decode path at up to 8 rows (small_decode_max_rows=8);
    "FLASHINFER" pins the path off (small_decode_max_rows=0; the default takes one-row
    steps) so only the wrappers decode. SmolLM2 (group size 3) decodes on tensor cores, so
    under multi-step decoding both get decode-loop graphs at every size."""
    if backend == "FLASHINFER-small":
        return "FLASHINFER", True, {"small_decode_max_rows": 8}
    return backend, False, {"small_decode_max_rows": 0}


def _count_calls(monkeypatch, module, name: str) -> dict:
    """Count calls (``{"n": calls}``) of ``module.name`` in this in-process engine."""
    calls = {"n": 0}
    real = getattr(module, name)

    def counted(*args, **kwargs):
        calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def _count_loop_calls(monkeypatch) -> dict:
    """Count multi-step calls served by a decode-loop graph (``{"n": calls}``) in this
    in-process engine: GraphRunner.run_loop calls that did not decline (None)."""
    from vllm.cudagraph.runner import GraphRunner

    calls = {"n": 0}
    real = GraphRunner.run_loop

    def counted(self, batch, n):
        ring = real(self, batch, n)
        calls["n"] += ring is not None
        return ring

    monkeypatch.setattr(GraphRunner, "run_loop", counted)
    return calls


def _assert_backend_ran(llm, wrapper_decode=True, small_decode=False, wrapper_prefill=True):
    """A FLASHINFER test fails unless, after start-up, FlashInfer's prefill wrapper ran (or,
    with ``wrapper_prefill`` False, for one-prompt prefills, the prefill graphs did) and, as
    asked, its decode wrapper (batches above small_decode_max_rows) and the Triton
    small-decode path (batches up to it)."""
    runner = llm.llm_engine.executor.worker.model_runner
    if runner.attn_backend.name == "FLASHINFER":
        runs = _runs_since_start(llm)
        if wrapper_prefill:
            assert runs["prefill_runs"] > 0, runs
        else:
            assert runs["graph_prefill_runs"] > 0 and runs["prefill_runs"] == 0, runs
        if wrapper_decode:
            assert runs["decode_runs"] > 0, runs
        assert (runs["small_decode_runs"] > 0) == small_decode, runs


@pytest.mark.forked
@pytest.mark.parametrize("backend", ["FLASHINFER", "FLASHINFER-small", "TORCH_SDPA"])
@pytest.mark.parametrize("enforce_eager", [False, True])
def test_smollm2_vs_transformers(smollm2_gguf, backend, enforce_eager):
    """8 prompts: every decode batch has at most 8 rows, so "FLASHINFER-small" decodes on
    the Triton small path only and FLASHINFER on FlashInfer's decode wrapper only."""
    backend, small, rows = _backend(backend)
    ref = hf_greedy(smollm2_gguf, PROMPTS, 32, dtype="bfloat16", device="cuda")
    llm = _llm(smollm2_gguf, backend, enforce_eager=enforce_eager, max_num_seqs=16, **rows)
    ours = vllm_greedy(llm, PROMPTS, 32, logprobs=5)
    check_logprobs_close(ref, ours, "hf", f"vllm-{backend}-eager={enforce_eager}", PROMPTS)
    assert ours[0][1].startswith(" Paris")
    _assert_backend_ran(llm, wrapper_decode=not small, small_decode=small)
    snap = _counters(llm)
    if enforce_eager:
        assert snap["graph"] == {} and snap["eager"][0]["enforce_eager"] > 0
    else:
        assert sum(snap["graph"][0].values()) > 0
        assert set(snap["eager"][0]) == {"prefill"}


@pytest.mark.forked
@pytest.mark.parametrize("steps", [1, 8, 16])
@pytest.mark.parametrize("backend", ["FLASHINFER", "FLASHINFER-small", "TORCH_SDPA"])
def test_single_sequence_vs_transformers(smollm2_gguf, backend, steps, monkeypatch):
    """Batch 1 decodes through the vllm.kernels.gemv projections (one row, SmolLM2's small
    weights): each prompt alone, graphs, logprobs-close to transformers. The size-1 graph
    must have been captured through the fused kernels (counted) and replayed. With 8
    scheduler steps and a backend that advances on the device (TORCH_SDPA, the FLASHINFER
    small path) the greedy calls without logprobs run the size-1 decode-loop graph
    (counted), and give the tokens of the calls with logprobs (the per-step path); so does
    FLASHINFER's wrapper path, planned once per call (SmolLM2's group size 3 decodes on
    tensor cores: vllm/attention/backends/flashinfer/loop_plan.py)."""
    from vllm.kernels import gemv

    loops = _count_loop_calls(monkeypatch)
    gemv_calls = _count_calls(monkeypatch, gemv, "norm_linear")
    backend, small, rows = _backend(backend)
    ref = hf_greedy(smollm2_gguf, PROMPTS[:3], 24, dtype="bfloat16", device="cuda")
    llm = _llm(smollm2_gguf, backend, max_num_seqs=8, num_scheduler_steps=steps, **rows)
    ours = [vllm_greedy(llm, [p], 24, logprobs=5)[0] for p in PROMPTS[:3]]
    check_logprobs_close(ref, ours, "hf", f"vllm-{backend}-batch1", PROMPTS[:3])
    assert ours[0][1].startswith(" Paris")
    # Python runs them while capturing size 1; replays run their kernels
    assert gemv_calls["n"] > 0, gemv_calls
    assert _counters(llm)["graph"][0].get(1, 0) > 0
    assert loops["n"] == 0  # logprobs: never the loop graph
    if steps > 1:
        plain = [vllm_greedy(llm, [p], 24)[0] for p in PROMPTS[:3]]
        assert loops["n"] > 0
        check_outputs_equal(ours, plain, "per-step path", "decode-loop graph", PROMPTS[:3])
    # each prompt alone: its prefill replays a prefill graph, never the planned wrapper
    _assert_backend_ran(llm, wrapper_decode=not small, small_decode=small, wrapper_prefill=False)


@pytest.mark.forked
@pytest.mark.parametrize("backend", ["FLASHINFER", "TORCH_SDPA"])
def test_prefill_graphs(smollm2_gguf, backend, monkeypatch):
    """Each prompt alone: its prefill replays the prefill graph of the next token count up
    (counted per count), close to transformers, and exactly equal to an --enforce-eager
    engine whose one-sequence prefills are padded alike (pad_eager_batches: the same
    kernels on the same shapes). A prompt above the largest prefill graph (64 tokens here)
    runs eagerly."""
    from vllm import SamplingParams
    from vllm.cudagraph.sizes import prefill_capture_sizes

    backend, _, rows = _backend(backend)
    prompts = PROMPTS[:3] + [" ".join(PROMPTS), " ".join(PROMPTS * 3)]
    ref = hf_greedy(smollm2_gguf, prompts, 16, dtype="bfloat16", device="cuda")
    llm = _llm(smollm2_gguf, backend, max_num_seqs=8, prefill_graph_max_tokens=64, **rows)
    ours = [vllm_greedy(llm, [p], 16, logprobs=5)[0] for p in prompts]
    check_logprobs_close(ref, ours, "hf", f"vllm-{backend}-prefill-graphs", prompts)
    assert ours[0][1].startswith(" Paris")
    snap = _counters(llm)
    runs = _runs_since_start(llm)
    one = SamplingParams(max_tokens=1)
    lens = [len(llm.generate([p], one, use_tqdm=False)[0].prompt_token_ids) for p in prompts]
    sizes = prefill_capture_sizes(64)
    want: dict[int, int] = {}
    for n in lens:
        if n <= 64:
            size = next(s for s in sizes if s >= n)
            want[size] = want.get(size, 0) + 1
    assert lens[-1] > 64 and len(want) >= 2, lens  # two graph sizes and one eager prompt
    assert snap["prefill_graph"][0] == want, (lens, snap)
    assert snap["eager"][0] == {"prefill": 1}, (lens, snap)
    if llm.llm_engine.executor.worker.model_runner.attn_backend.name == "FLASHINFER":
        # one graph prefill per replay; the planned wrapper for the long prompt alone
        assert runs["graph_prefill_runs"] == sum(want.values()), (runs, want)
        assert runs["prefill_runs"] == 1, runs
    llm.llm_engine.shutdown()
    del llm
    eager = _llm(smollm2_gguf, backend, max_num_seqs=8, enforce_eager=True,
                 prefill_graph_max_tokens=64, **rows)  # fmt: skip
    eager.llm_engine.executor.worker.model_runner.pad_eager_batches = True
    e = [vllm_greedy(eager, [p], 16, logprobs=5)[0] for p in prompts]
    check_outputs_equal(ours, e, "prefill graphs", "eager padded alike", prompts)


def _drifting_run(llm, n):
    """n requests whose max_tokens differ (8 + 2i), so the live batch shrinks n -> 1."""
    from vllm import SamplingParams

    prompts = [PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)) for i in range(n)]
    params = [
        SamplingParams(temperature=0, max_tokens=8 + 2 * i, ignore_eos=True) for i in range(n)
    ]
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [(list(o.outputs[0].token_ids), o.outputs[0].text) for o in outs]


@pytest.mark.forked
@pytest.mark.parametrize("backend", ["FLASHINFER", "FLASHINFER-small", "TORCH_SDPA"])
def test_graph_equals_eager_as_batch_drifts(smollm2_gguf, backend):
    backend, small, rows = _backend(backend)
    sizes = [1, 3, 5, 7, 9, 17, 33]
    graph = _llm(smollm2_gguf, backend, max_num_seqs=40, **rows)
    g = {n: _drifting_run(graph, n) for n in sizes}
    snap = _counters(graph)
    _assert_backend_ran(graph, small_decode=small)  # small path: up to 8 rows only
    runner = graph.llm_engine.executor.worker.model_runner
    expected = {runner.capture_sizes.padded_size(b) for b in range(1, 34)}
    assert set(snap["graph"][0]) == expected, snap
    assert set(snap["eager"][0]) == {"prefill"}, snap
    graph.llm_engine.shutdown()
    del graph
    eager = _llm(smollm2_gguf, backend, max_num_seqs=40, enforce_eager=True, **rows)
    # Same batch composition (docs/design.md): eager decode batches padded to the captured
    # sizes, so both runs multiply the same shapes and only graph replay differs.
    eager.llm_engine.executor.worker.model_runner.pad_eager_batches = True
    for n in sizes:
        check_outputs_equal(g[n], _drifting_run(eager, n), f"graph-{n}", f"eager-{n}")


@pytest.mark.forked
@pytest.mark.parametrize("steps", [8, 16])
@pytest.mark.parametrize("backend", ["FLASHINFER", "FLASHINFER-small", "TORCH_SDPA"])
def test_multi_step_graphs(smollm2_gguf, backend, steps, monkeypatch):
    """--num-scheduler-steps 8 and 16 on graphs: close to transformers; exact vs the same
    multi-step run eager on padded batches as the batch drifts. Greedy calls run
    decode-loop graphs: TORCH_SDPA up to 8 rows (larger batches replay plain graphs step
    by step), FLASHINFER at every size (its small path up to its limit, its tensor-core
    wrappers above, planned once per call)."""
    backend, small, rows = _backend(backend)
    loops = _count_loop_calls(monkeypatch)
    ref = hf_greedy(smollm2_gguf, PROMPTS, 32, dtype="bfloat16", device="cuda")
    llm = _llm(smollm2_gguf, backend, max_num_seqs=40, num_scheduler_steps=steps, **rows)
    ours = vllm_greedy(llm, PROMPTS, 32, logprobs=5)
    check_logprobs_close(ref, ours, "hf", f"vllm-{backend}-multi-step", PROMPTS)
    sizes = [1, 5, 17]
    g = {n: _drifting_run(llm, n) for n in sizes}
    snap = _counters(llm)
    _assert_backend_ran(llm, small_decode=small)
    assert sum(snap["graph"][0].values()) > 0 and set(snap["eager"][0]) == {"prefill"}, snap
    assert loops["n"] > 0
    llm.llm_engine.shutdown()
    del llm
    eager = _llm(smollm2_gguf, backend, max_num_seqs=40, enforce_eager=True,
                 num_scheduler_steps=steps, **rows)  # fmt: skip
    eager.llm_engine.executor.worker.model_runner.pad_eager_batches = True
    for n in sizes:
        check_outputs_equal(
            g[n], _drifting_run(eager, n), f"graph-ms{steps}-{n}", f"eager-ms{steps}-{n}"
        )


H, H_KV, D, BS, BLOCKS = 9, 3, 64, 16, 64  # SmolLM2's heads: tensor-core decode


def _flashinfer_size4():
    """A FLASHINFER graph state (FlashInfer's own decode: small_decode_max_rows=0) of 8
    rows, its size-4 capture metadata, a random bf16 cache of BLOCKS (+ scratch) blocks, a
    layer stand-in and zero q / k / v inputs of 4 rows."""
    import torch

    from vllm.attention.backends.abstract import AttentionSpec
    from vllm.attention.backends.flashinfer import FlashInferBackend

    torch.manual_seed(0)
    spec = AttentionSpec(H, H_KV, D, BS, torch.bfloat16, torch.device("cuda"), 1024, 0)
    backend = FlashInferBackend(spec)
    cache = torch.randn(BLOCKS + 1, 2, BS, H_KV, D, dtype=torch.bfloat16, device="cuda")
    state = backend.make_graph_state(BLOCKS * BS)
    state.allocate(8)
    md = state.metadata_for_capture(4)

    class Layer:
        num_heads, num_kv_heads, head_size, scale = H, H_KV, D, D**-0.5

    q = torch.zeros(4, H * D, dtype=torch.bfloat16, device="cuda")
    k = torch.zeros(4, H_KV * D, dtype=torch.bfloat16, device="cuda")
    return backend, state, md, cache, Layer, q, k, torch.zeros_like(k)


def _assert_attends(got, q_row, cache, table, n):
    """``got`` [H * D] equals softmax attention of ``q_row`` [H * D] over the first ``n``
    tokens of ``table``'s blocks of ``cache`` (float32 reference, bf16 tolerance)."""
    import torch

    kk = cache[table, 0].reshape(-1, H_KV, D)[:n].float().repeat_interleave(H // H_KV, dim=1)
    vv = cache[table, 1].reshape(-1, H_KV, D)[:n].float().repeat_interleave(H // H_KV, dim=1)
    att = torch.einsum("hd,nhd->hn", q_row.view(H, D).float(), kk) * D**-0.5  # [H, n]
    ref = torch.einsum("hn,nhd->hd", att.softmax(-1), vv)  # [H, D]
    got = got.view(H, D).float()
    assert torch.allclose(got, ref, atol=2e-2, rtol=2e-2), (n, (got - ref).abs().max())


@pytest.mark.forked
def test_flashinfer_replay_past_capture_time():
    """Graphs captured at context length 1, replayed at per-lane lengths that cross page
    boundaries: FlashInfer's decode equals a plain PyTorch attention reference."""
    import torch

    from vllm.attention.backends.abstract import ForwardMode, StepInputs
    from vllm.attention.backends.flashinfer.metadata import FlashInferImpl

    _, state, md, cache, Layer, q, k, v = _flashinfer_size4()
    FlashInferImpl.forward(Layer, q, k, v, cache, md)  # warm-up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = FlashInferImpl.forward(Layer, q, k, v, cache, md)
    lens = [1, 17, 33, 100]
    tables = [list(range(i * 8, i * 8 + -(-n // BS))) for i, n in enumerate(lens)]
    slots = [t[(n - 1) // BS] * BS + (n - 1) % BS for t, n in zip(tables, lens)]
    step = StepInputs(ForwardMode.DECODE, lens, [1] * 4, tables, slots, 4)
    for x in (q, k, v):
        x.copy_(torch.randn_like(x))
    state.prepare_replay(4, step, md)
    graph.replay()
    torch.cuda.synchronize()
    for i, (n, t) in enumerate(zip(lens, tables)):
        _assert_attends(out[i], q[i], cache, t, n)


@pytest.mark.forked
@pytest.mark.parametrize("steps", [8, 16, 40])
def test_flashinfer_loop_plan_each_step(steps):
    """A graph of FlashInfer's tensor-core decode plus ``advance``, planned once for the
    call's last step (``prepare_loop``) and replayed once per step (8, 16, and 40: a row
    crosses more than two pages inside the call): every step writes the
    new key / value at its own slot and attends to exactly its own length, equal to a
    plain PyTorch reference, while rows cross page boundaries inside the call (step 0's
    ``last_page_len`` zero or negative) and the padded lane stays on the scratch slot."""
    import torch

    from vllm.attention.backends.abstract import ForwardMode, StepInputs
    from vllm.attention.backends.flashinfer.metadata import FlashInferImpl

    scratch = BLOCKS * BS
    backend, state, md, cache, Layer, q, k, v = _flashinfer_size4()
    assert backend.loops_over_wrappers  # group size 3: tensor-core decode
    pos = torch.zeros(4, dtype=torch.long, device="cuda")

    def step():
        o = FlashInferImpl.forward(Layer, q, k, v, cache, md)
        pos.add_(1)
        state.advance(md, pos)
        return o

    step()  # warm-up (every lane on the scratch block)
    state.prepare_replay(4, StepInputs.padded_decode(4), md)
    pos.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    lens = [14, 30, 100]  # rows 0 and 1 enter a new page inside the call, row 2 does not
    tables = [list(range(i * 10, i * 10 + -(-(n + steps - 1) // BS))) for i, n in
              enumerate(lens)]  # fmt: skip
    slots = [t[(n - 1) // BS] * BS + (n - 1) % BS for t, n in zip(tables, lens)]
    first = StepInputs(ForwardMode.DECODE, lens + [0], [1] * 4, tables + [[]], slots + [-1], 3)
    state.prepare_loop(4, first, md, steps)
    pos.copy_(torch.tensor([n - 1 for n in lens] + [0]))
    for i in range(steps):
        for x in (q, k, v):
            x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        for r, (n0, t) in enumerate(zip(lens, tables)):
            n = n0 + i
            page, off = t[(n - 1) // BS], (n - 1) % BS
            assert torch.equal(cache[page, 0, off], k[r].view(H_KV, D)), (i, r)
            _assert_attends(out[r], q[r], cache, t, n)
        assert int(state.slot_rows[0, 3]) == scratch  # the padded lane stays idle


@pytest.mark.forked
def test_two_virtual_engines_one_gpu(smollm2_gguf):
    """The upstream PP failure reproduced on one GPU: two VEs captured with the real
    FlashInfer wrappers start and give the same tokens on both engines."""
    with virtual_engines_override(2):
        llm = _llm(smollm2_gguf, "FLASHINFER", max_num_seqs=8)
    runner = llm.llm_engine.executor.worker.model_runner
    assert runner.graph_runner.captured_sizes(0) == [1, 2, 4, 8]
    assert runner.graph_runner.captured_sizes(1) == [1, 2, 4, 8]
    outs = vllm_greedy(llm, [PROMPTS[0], PROMPTS[0], PROMPTS[1], PROMPTS[1]], 24)
    assert outs[0][0] == outs[1][0] and outs[2][0] == outs[3][0]
    snap = _counters(llm)
    assert sum(snap["graph"][0].values()) > 0 and sum(snap["graph"][1].values()) > 0, snap


@pytest.mark.forked
def test_two_virtual_engines_shared_buffers_raise(smollm2_gguf, monkeypatch):
    from tests.worker.fakes import reintroduce_shared_rebound_buffers

    reintroduce_shared_rebound_buffers(monkeypatch)
    with pytest.raises(ValueError, match="The batch size should be fixed in cudagraph mode"):
        with virtual_engines_override(2):
            _llm(smollm2_gguf, "FLASHINFER", max_num_seqs=8)


@pytest.mark.forked
def test_eager_beyond_the_maximum(smollm2_gguf):
    kw = dict(max_num_seqs=64, max_cudagraph_capture_size=16)
    from vllm import SamplingParams

    prompts = [f"{PROMPTS[i % 8]} ({i})" for i in range(40)]
    # 40 live rows shrinking to 1: batches above 16 run eagerly, the rest replay
    params = [SamplingParams(temperature=0, max_tokens=4 + i, ignore_eos=True) for i in range(40)]

    def run(llm):
        outs = llm.generate(prompts, params, use_tqdm=False)
        return [(list(o.outputs[0].token_ids), o.outputs[0].text) for o in outs]

    llm = _llm(smollm2_gguf, "FLASHINFER", **kw)
    g = run(llm)
    snap = _counters(llm)
    assert snap["eager"][0].get("too_big", 0) > 0 and sum(snap["graph"][0].values()) > 0, snap
    llm.llm_engine.shutdown()
    del llm
    e = run(_llm(smollm2_gguf, "FLASHINFER", enforce_eager=True, **kw))
    check_outputs_equal(g, e, "graphs<=16", "eager", prompts)


@pytest.mark.forked
@pytest.mark.parametrize("max_num_seqs", [8, 256, 512])
def test_startup_sizes(smollm2_gguf, max_num_seqs):
    llm = _llm(smollm2_gguf, "FLASHINFER", max_num_seqs=max_num_seqs)
    gr = llm.llm_engine.executor.worker.model_runner.graph_runner
    assert gr.max_batchsize_to_capture == min(max_num_seqs, 512)
    assert vllm_greedy(llm, PROMPTS[:1], 8)[0][1].startswith(" Paris")
    print(
        f"max_num_seqs={max_num_seqs}: captured {len(gr.sizes.sizes)} sizes in "
        f"{gr.capture_seconds:.2f} s, {gr.capture_bytes / 2**30:.3f} GiB; "
        f"blocks={llm.llm_engine.config.cache_config.num_gpu_blocks}"
    )


@pytest.mark.forked
def test_blocks_grow_with_memory_utilization(smollm2_gguf):
    import gc

    blocks = []
    for util in (0.3, 0.6):
        llm = _llm(smollm2_gguf, "FLASHINFER", max_num_seqs=8, gpu_memory_utilization=util)
        blocks.append(llm.llm_engine.config.cache_config.num_gpu_blocks)
        llm.llm_engine.shutdown()
        del llm
        gc.collect()
    print(f"blocks at 0.3: {blocks[0]}, at 0.6: {blocks[1]}")
    assert blocks[1] > blocks[0] * 1.5, blocks
