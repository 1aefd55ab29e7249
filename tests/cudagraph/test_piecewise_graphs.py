"""Piecewise CUDA graphs on CPU (vllm/cudagraph/piecewise.py), with the production capture,
planning and replay code and only the graph object (and FlashInfer's wrappers) replaced by
fakes: prefill and mixed steps replay the pieces of the next captured token count up, with
the attention run eagerly between them on the step's real tokens; they equal the same
pieces run eagerly at the padded size exactly and the plain eager forward in tokens and
logprobs; what no piecewise size serves runs eagerly with its reason."""

import pytest
import torch

from tests.cudagraph.test_graph_capture import decode_request, make_worker
from vllm.sampling_params import SamplingParams
from vllm.sequence import ExecuteModelRequest, SequenceData, SequenceGroupMetadata

PARAMS = SamplingParams(temperature=0, max_tokens=4, logprobs=2)
TABLES = {0: [0, 1, 2], 1: [3], 2: [4]}  # 40-token prompt "a", 5-token prompts "b", "c"
CHUNKED = dict(max_num_seqs=8, enable_chunked_prefill=True, max_num_batched_tokens=64,
               prefill_graph_max_tokens=0)  # fmt: skip


def _data():
    return {
        0: SequenceData([(3 * j) % 300 + 7 for j in range(40)]),
        1: SequenceData([11, 12, 13, 14, 15]),
        2: SequenceData([21, 22, 23, 24, 25]),
    }


def _md(sid, data, is_prompt, **kw):
    return SequenceGroupMetadata(f"r{sid}", is_prompt, {sid: data[sid]}, PARAMS,
                                 {sid: TABLES[sid]}, **kw)  # fmt: skip


def _step(worker, groups):
    """One step; appends each sampled token; [(seq_id, token, logprob)]."""
    out = worker.execute_model(ExecuteModelRequest(groups))
    rows = []
    for md, o in zip(groups, out.outputs):
        for s in o.samples:
            md.seq_data[s.parent_seq_id].append_token_id(s.output_token, 0.0)
            rows.append((s.parent_seq_id, s.output_token, s.logprobs[s.output_token].logprob))
    return rows


def _chunked_schedule(worker):
    """Prompt "a" in chunks of 30 and 10 tokens: a prefill step of three prompts (30 + 5 + 5 = 40
    tokens), a mixed step (10 + 2 decode rows), two decode steps."""
    d = _data()
    steps = [
        [_md(0, d, True, token_chunk_size=30, do_sample=False), _md(1, d, True),
         _md(2, d, True)],
        [_md(0, d, True, token_chunk_size=10, computed_lens={0: 30}), _md(1, d, False),
         _md(2, d, False)],
        [_md(s, d, False) for s in (0, 1, 2)],
        [_md(s, d, False) for s in (0, 1, 2)],
    ]  # fmt: skip
    return [_step(worker, groups) for groups in steps]


@pytest.mark.forked
@pytest.mark.parametrize("backend", ["TORCH_SDPA", "FLASHINFER"])
def test_prefill_and_mixed_steps_replay_pieces(tiny_llama_dir, backend):
    g = make_worker(tiny_llama_dir, 1, backend, piecewise_graph_max_tokens=64, **CHUNKED)
    padded = make_worker(tiny_llama_dir, 1, backend, capture=False,
                         piecewise_graph_max_tokens=64, **CHUNKED)  # fmt: skip
    padded.model_runner.pad_eager_batches = True
    plain = make_worker(tiny_llama_dir, 1, backend, capture=False, **CHUNKED)
    gr = g.model_runner.graph_runner
    assert gr.captured_sizes(0, "piecewise") == [16, 24, 32, 48, 64]
    # rows past a step's tokens are never written by its attention: poison them, so any
    # padded row that reached a real one would turn the outputs into NaN
    with torch.inference_mode():
        gr.graphs.piece_buffers[0].attn.fill_(float("nan"))
    pieces = gr.graphs.piecewise[0][48]
    layers = g.model_runner.model.config.num_hidden_layers
    assert layers >= 2 and len(pieces.graphs) == layers + 1  # cut at every attention call
    got, want, ref = (_chunked_schedule(w) for w in (g, padded, plain))
    assert got == want  # the same pieces at the same padded sizes: bit-exact
    assert [[(s, t) for s, t, _ in step] for step in got] == [
        [(s, t) for s, t, _ in step] for step in ref
    ]
    lp = torch.tensor([lp for step in got for _, _, lp in step])
    ref_lp = torch.tensor([lp for step in ref for _, _, lp in step])
    assert torch.allclose(lp, ref_lp, atol=1e-5), (lp, ref_lp)
    snap = g.model_runner.counters.snapshot()
    # 40 prefill tokens -> pieces of 48; 12 mixed tokens -> 16; decodes: 3 rows -> graph of 4
    assert snap["piecewise_graph"] == {0: {16: 1, 48: 1}}, snap
    assert snap["eager"] == {} and snap["graph"] == {0: {4: 2}}, snap
    assert padded.model_runner.counters.snapshot()["eager"] == {
        0: {"prefill": 1, "mixed": 1, "enforce_eager": 2}
    }
    assert plain.model_runner.counters.snapshot()["piecewise_graph"] == {}


@pytest.mark.forked
def test_piecewise_plan(tiny_llama_dir):
    """Prefill graphs first (one context-free prompt they cover), then piecewise graphs for
    any prefill or mixed step up to the largest piecewise size; above it, eager with the
    step's reason. Decode steps plan as before."""
    from vllm.attention.backends.abstract import ForwardMode
    from vllm.cudagraph import Plan

    dec, pre, mix = ForwardMode.DECODE, ForwardMode.PREFILL, ForwardMode.MIXED
    kw = dict(CHUNKED, prefill_graph_max_tokens=32, piecewise_graph_max_tokens=48)
    gr = make_worker(tiny_llama_dir, 1, **kw).model_runner.graph_runner
    assert gr.captured_sizes(0, "prefill") == [16, 24, 32]
    assert gr.captured_sizes(0, "piecewise") == [16, 24, 32, 48]
    assert gr.plan(0, pre, 1, 20) == Plan(24, 24, None)  # prefill graph
    assert gr.plan(0, pre, 1, 20, has_context=True) == Plan(24, 24, None, piecewise=True)
    assert gr.plan(0, pre, 1, 40) == Plan(48, 48, None, piecewise=True)
    assert gr.plan(0, pre, 3, 17) == Plan(24, 24, None, piecewise=True)
    assert gr.plan(0, mix, 3, 48) == Plan(48, 48, None, piecewise=True)
    assert gr.plan(0, mix, 3, 49) == Plan(0, None, "mixed")
    assert gr.plan(0, pre, 2, 49) == Plan(0, None, "prefill")
    assert gr.plan(0, dec, 3, 3, 10) == Plan(4, 4, None)
    eager = make_worker(tiny_llama_dir, 1, capture=False, **kw).model_runner.graph_runner
    assert eager.plan(0, mix, 3, 20) == Plan(0, None, "mixed")
    assert eager.plan(0, mix, 3, 20, pad_eager=True) == Plan(24, None, "mixed", piecewise=True)
    off = make_worker(tiny_llama_dir, 1, **CHUNKED).model_runner.graph_runner
    assert off.captured_sizes(0, "piecewise") == [] and off.spec.piecewise_sizes == ()
    assert off.plan(0, mix, 3, 20) == Plan(0, None, "mixed")


@pytest.mark.forked
@pytest.mark.parametrize(
    "family", ["tiny_gemma3_dir", "tiny_qwen3_moe_dir", "tiny_granite_dir", "tiny_olmo2_dir"]
)
def test_families_pieces_equal_eager(family, request):
    """Gemma 3 (its own post-attention block, sliding and global layers), Qwen3-MoE
    (row-wise expert routing inside the pieces), Granite (embedding and residual
    multipliers in the first piece and in every post-attention block) and OLMo 2 (post-norm
    layers: the residual add moves into the next piece): a two-prompt prefill replayed as
    pieces, then decodes, give the plain eager tokens and logprobs."""
    model = request.getfixturevalue(family)
    kw = dict(max_num_seqs=8, prefill_graph_max_tokens=0)
    g = make_worker(model, 1, piecewise_graph_max_tokens=64, **kw)
    plain = make_worker(model, 1, capture=False, **kw)
    results = []
    for w in (g, plain):
        req = decode_request(2, ctx=21)  # 2 x 21 prompt tokens: pieces of 48
        for m in req.seq_group_metadata_list:
            m.is_prompt = True
            m.sampling_params = PARAMS
        rows = []
        for _ in range(3):
            out = w.execute_model(req)
            for m, o in zip(req.seq_group_metadata_list, out.outputs):
                s = o.samples[0]
                rows.append((s.output_token, s.logprobs[s.output_token].logprob))
                m.is_prompt = False
                m.seq_data[s.parent_seq_id].append_token_id(s.output_token, 0.0)
        results.append(rows)
    got, ref = results
    assert [t for t, _ in got] == [t for t, _ in ref]
    assert torch.allclose(torch.tensor(got)[:, 1], torch.tensor(ref)[:, 1], atol=1e-5)
    assert g.model_runner.counters.snapshot()["piecewise_graph"] == {0: {48: 1}}
