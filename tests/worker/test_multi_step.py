"""Multi-step decoding (num_scheduler_steps) on CPU float32: the same greedy and seeded tokens
as one-token steps (docs/design.md: exact), logprobs within 1e-5 (a sequence that finished
mid-call keeps its row until the call ends, so batch shapes differ), stops honoured token
by token, the step cap, fake-graph replays through the multi-step loop, and validation."""

import pytest
import torch

from tests.cudagraph.test_graph_capture import make_worker, multi_step_call
from tests.utils import check_outputs_equal, completion_tuple
from vllm.attention.backends.flashinfer import flashinfer as flashinfer_module
from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.sequence import SequenceData, SequenceGroupMetadata
from vllm.worker.multi_step import decode_steps

PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7], [100, 200, 300, 400], [11, 12, 13], [42] * 5, [9, 99, 999]]


@pytest.fixture(autouse=True)
def _small_cache(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")


def _generate(model, params, steps, **kw):
    """(outputs as (ids, text, logprobs), worker execute_model calls) for one LLM run."""
    from vllm import LLM

    llm = LLM(model=model, device="cpu", num_scheduler_steps=steps, **kw)
    worker = llm.llm_engine.executor.worker
    calls = []
    real = worker.execute_model
    worker.execute_model = lambda req, *a: calls.append(req) or real(req, *a)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    res = [(*completion_tuple(o), o.outputs[0].finish_reason) for o in outs]
    llm.llm_engine.shutdown()
    return res, calls


def _assert_same(base, multi):
    check_outputs_equal(base, multi, "1 step", "multi-step", PROMPTS)
    for b, m in zip(base, multi):
        assert b[3] == m[3]  # finish reasons
        if b[2] is not None:
            for pb, pm in zip(b[2], m[2]):
                assert pb.keys() == pm.keys()
                for t in pb:
                    assert abs(pb[t] - pm[t]) < 1e-5, (t, pb[t], pm[t])


@pytest.mark.forked
@pytest.mark.parametrize("steps, max_num_seqs", [(4, 3), (8, 8)])
def test_greedy_equals_one_token_steps(tiny_llama_dir, steps, max_num_seqs):
    """Different max_tokens per prompt: sequences finish inside a call."""
    params = [
        SamplingParams(temperature=0, max_tokens=5 + 3 * i, logprobs=2) for i in range(len(PROMPTS))
    ]
    base, calls1 = _generate(tiny_llama_dir, params, 1, max_num_seqs=max_num_seqs)
    multi, calls = _generate(tiny_llama_dir, params, steps, max_num_seqs=max_num_seqs)
    _assert_same(base, multi)
    assert [len(o[0]) for o in multi] == [5 + 3 * i for i in range(len(PROMPTS))]
    assert len(calls) < len(calls1) / 2, (len(calls), len(calls1))
    decode = [r for r in calls if not r.seq_group_metadata_list[0].is_prompt]
    assert decode and all(r.num_lookahead_slots == steps - 1 for r in decode)


@pytest.mark.forked
def test_seeded_sampling_and_stops_equal(tiny_llama_dir):
    """Seeded random rows draw from their own generators in the same order; a stop token
    in the middle of a call cuts the output there."""
    base_params = [
        SamplingParams(temperature=0.9, top_p=0.9, seed=11 + i, max_tokens=12)
        for i in range(len(PROMPTS))
    ]
    base, _ = _generate(tiny_llama_dir, base_params, 1)
    multi, _ = _generate(tiny_llama_dir, base_params, 4)
    _assert_same(base, multi)
    # stop on a token the first prompt produces at position 5 (inside the second call)
    stop_tok = base[0][0][5]
    stop_params = [
        SamplingParams(
            temperature=0.9, top_p=0.9, seed=11 + i, max_tokens=12, stop_token_ids=[stop_tok]
        )
        for i in range(len(PROMPTS))
    ]
    base_s, _ = _generate(tiny_llama_dir, stop_params, 1)
    multi_s, _ = _generate(tiny_llama_dir, stop_params, 4)
    _assert_same(base_s, multi_s)
    assert multi_s[0][0][-1] == stop_tok and multi_s[0][3] == "stop"
    assert len(multi_s[0][0]) <= 6


@pytest.mark.forked
def test_penalties_and_min_tokens_inside_a_call(tiny_llama_dir):
    """Penalties see the tokens sampled earlier in the same call, and a min_tokens mask
    ends at the right step inside a call: equal to one-token steps, in fewer calls."""
    greedy, _ = _generate(tiny_llama_dir, SamplingParams(temperature=0, max_tokens=12), 1)
    pen = [
        # the random tiny model never repeats a token: penalties that REWARD repeats make
        # each step depend on the tokens sampled earlier in the call
        SamplingParams(temperature=0, max_tokens=12, repetition_penalty=0.2),
        SamplingParams(
            temperature=0, max_tokens=12, repetition_penalty=0.5, frequency_penalty=-2.0
        ),
        SamplingParams(temperature=0, max_tokens=12, repetition_penalty=0.3, presence_penalty=-2.0),
        # stop on the token greedy decoding emits 7th, min_tokens 6: masked (but never the
        # argmax) for the first 6 tokens, allowed at the 7th, the 2nd step of a call
        SamplingParams(
            temperature=0, max_tokens=12, min_tokens=6, stop_token_ids=[greedy[3][0][6]]
        ),
        SamplingParams(temperature=0.8, seed=3, max_tokens=12, repetition_penalty=0.5),
    ]
    base, calls1 = _generate(tiny_llama_dir, pen, 1)
    multi, calls = _generate(tiny_llama_dir, pen, 4)
    _assert_same(base, multi)
    assert len(calls) < len(calls1) / 2, (len(calls), len(calls1))
    for i in range(3):  # the penalties changed the output: tokens repeat
        assert base[i][0] != greedy[i][0] and len(set(base[i][0])) < 12, base[i][0]
    assert multi[3][0] == greedy[3][0][:7] and multi[3][3] == "stop"


@pytest.mark.forked
def test_max_model_len_boundary(tiny_llama_dir):
    """Sequences run into max_model_len inside a call: same tokens, finish reason length."""
    params = SamplingParams(temperature=0, max_tokens=None)
    base, _ = _generate(tiny_llama_dir, params, 1, max_model_len=19)
    multi, _ = _generate(tiny_llama_dir, params, 8, max_model_len=19)
    _assert_same(base, multi)
    assert [len(p) + len(o[0]) for p, o in zip(PROMPTS, multi)] == [19] * len(PROMPTS)
    assert {o[3] for o in multi} == {"length"}


def _md(lens, max_tokens, outputs=0):
    groups = []
    for i, n in enumerate(lens):
        data = SequenceData(list(range(3, 3 + n - outputs)))
        for _ in range(outputs):
            data.append_token_id(5, 0.0)
        params = SamplingParams(max_tokens=max_tokens)
        groups.append(SequenceGroupMetadata(f"r{i}", False, {i: data}, params, {i: [0]}))
    return groups


def test_decode_steps_caps():
    assert decode_steps(_md([10, 20], 100), 8, 2048) == 8
    # the sequence closest to max_model_len caps the whole batch
    assert decode_steps(_md([10, 2045], 100), 8, 2048) == 3
    # no more steps than the most tokens any sequence still wants (outputs so far: 2)
    assert decode_steps(_md([10, 20], 5, outputs=2), 8, 2048) == 3
    assert decode_steps(_md([10], 1, outputs=1), 8, 2048) == 1
    assert decode_steps(_md([10], None), 8, 12) == 2


class _ReadWatch:
    """When the engine's ``async_callback`` runs inside a call of worker ``g``: the decode
    steps of graph size ``size`` replayed so far in the call, and the float64 tensors read
    to the host so far in it (the packed sampled rows; there must be none yet)."""

    def __init__(self, g, size, monkeypatch):
        self.g, self.size, self.mp = g, size, monkeypatch
        self.before = self._replayed()
        self.reads, self.entered, self.seen = 0, 0, []
        self.cpu, self.execute = torch.Tensor.cpu, g.execute_model

        def cpu(t, *args, **kw):  # a plain function: Tensor binds it to the tensor
            self.reads += t.dtype == torch.float64
            return self.cpu(t, *args, **kw)

        monkeypatch.setattr(torch.Tensor, "cpu", cpu)
        monkeypatch.setattr(g, "execute_model", self._execute)

    def _replayed(self):
        return self.g.model_runner.counters.snapshot()["graph"].get(0, {}).get(self.size, 0)

    def _execute(self, request):
        self.entered = self.reads
        return self.execute(request)

    def callback(self):
        self.seen.append((self._replayed() - self.before, self.reads - self.entered))

    def undo(self):
        self.mp.setattr(torch.Tensor, "cpu", self.cpu)
        self.mp.setattr(self.g, "execute_model", self.execute)


@pytest.mark.forked
@pytest.mark.parametrize("loop_graphs", ["1", "0"])
@pytest.mark.parametrize("backend", ["TORCH_SDPA", "FLASHINFER", "FLASHINFER-tensor-cores"])
def test_multi_step_replays_fake_graphs(tiny_llama_dir, backend, loop_graphs, monkeypatch):
    """The replay path of the loop (fake graphs, production capture/replay code): 4 replays
    per call, tokens equal to 4 one-token eager steps, contexts that cross a block boundary
    inside the call. With decode-loop graphs (vllm/cudagraph/decode_loop.py) every call is
    the loop graph of the padded size replayed 4 times (it advances positions, lengths and
    slots itself); without them the plain graph of that size is. FLASHINFER loops over its
    wrappers with tensor-core decode only (planned once per call: the fake wrapper reads
    each row's length from the page-table buffers at run time, as FlashInfer's kernel
    does); the tiny model's group size 2 takes CUDA-core decode unless forced."""
    if backend == "FLASHINFER-tensor-cores":
        monkeypatch.setattr(flashinfer_module, "use_tensor_cores", lambda h, kv: True)
        backend = "FLASHINFER"
    g = make_worker(tiny_llama_dir, 1, backend, max_num_seqs=8, num_scheduler_steps=4,
                    disable_decode_loop_graphs=loop_graphs == "0")  # fmt: skip
    loops = g.model_runner.graph_runner.graphs.loops[0]
    fi = g.model_runner.attn_backend if backend == "FLASHINFER" else None
    # CUDA-core FlashInfer decode plans every step on the host: no loop graphs
    can_loop = loop_graphs == "1" and (fi is None or fi.tensor_cores)
    assert sorted(loops) == ([1, 2, 4, 8] if can_loop else [])
    e = make_worker(tiny_llama_dir, 1, backend, capture=False, max_num_seqs=8)
    greedy = SamplingParams(temperature=0, max_tokens=50)
    for rows, ctx in ((1, 3), (3, 14), (5, 33)):
        replays_before = {s: lg.graph.replays for s, lg in loops.items()}
        plans = fi.decode_runs if fi is not None else 0
        size = g.model_runner.capture_sizes.padded_size(rows)
        watch = _ReadWatch(g, size, monkeypatch)
        got, want, delta = multi_step_call(g, e, rows, ctx, greedy, 4, watch.callback)
        watch.undo()
        assert delta == {size: 4}, delta
        # once, before the read: after the loop graph's launch, or after the first of the
        # steps replayed one by one (overlapping the rest)
        assert watch.seen == [(4 if loops else 1, 0)] and watch.reads, watch.seen
        if loops:
            assert loops[size].graph.replays - replays_before[size] == 4
        if fi is not None:  # one plan per call in a loop graph, else one per step
            assert fi.decode_runs - plans == (1 if loops else 4)
        assert got == want, (rows, ctx)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(num_scheduler_steps=0), "num_scheduler_steps must be at least 1"),
        (
            dict(
                num_scheduler_steps=4,
                speculative_model="[ngram]",
                num_speculative_tokens=3,
                ngram_prompt_lookup_max=3,
            ),
            "cannot be combined with speculative decoding",
        ),
    ],
)
def test_validation(tiny_llama_dir, kw, match):
    with pytest.raises(ValueError, match=match):
        EngineArgs(model=tiny_llama_dir, device="cpu", **kw).create_engine_config()


def test_lookahead_slots_follow_steps(tiny_llama_dir):
    cfg = EngineArgs(
        model=tiny_llama_dir, device="cpu", num_scheduler_steps=6
    ).create_engine_config()
    assert cfg.scheduler_config.num_lookahead_slots == 5


@pytest.mark.forked
def test_preemption_under_multi_step_equals_roomy_run(tiny_llama_dir):
    """A cache too small for 8 sequences with 7 lookahead slots each preempts (recompute)
    and still gives the tokens of a roomy one-token-step run."""
    from tests.spec_decode.test_spec_e2e import _engine_run

    prompts = [[10 + i, 20 + 3 * i, 30, 40 + i, 50] for i in range(8)]
    params = SamplingParams(temperature=0, max_tokens=30)
    roomy, p0, _, _ = _engine_run(tiny_llama_dir, prompts, params, max_num_seqs=8)
    tight, p1, _, _ = _engine_run(
        tiny_llama_dir, prompts, params, max_num_seqs=8, num_gpu_blocks_override=13,
        num_scheduler_steps=8, max_model_len=128,
    )  # fmt: skip
    assert p0 == 0 and p1 > 0, (p0, p1)
    check_outputs_equal(roomy, tight, "roomy, 1 step", "preempted, 8 steps", prompts)
