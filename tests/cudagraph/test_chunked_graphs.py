"""The CUDA-graph rule of chunked prefill on CPU, with the production capture and dispatch
code and only the graph object (and FlashInfer's wrappers) replaced by fakes: a step of
prefill chunks runs eagerly as a prefill, a step mixing a chunk with decode rows runs
eagerly with the reason "mixed", and a decode-only step replays its captured graph. The
tokens equal those of an unchunked eager worker."""

import pytest

from tests.cudagraph.test_graph_capture import make_worker
from vllm.sampling_params import SamplingParams
from vllm.sequence import ExecuteModelRequest, SequenceData, SequenceGroupMetadata

PARAMS = SamplingParams(temperature=0, max_tokens=4)
TABLES = {0: [0, 1], 1: [2], 2: [3]}  # 20-token prompt "a", 5-token prompts "b", "c"


def _data():
    return {
        0: SequenceData([(3 * j) % 300 + 7 for j in range(20)]),
        1: SequenceData([11, 12, 13, 14, 15]),
        2: SequenceData([21, 22, 23, 24, 25]),
    }


def _md(sid, data, is_prompt, **kw):
    return SequenceGroupMetadata(f"r{sid}", is_prompt, {sid: data[sid]}, PARAMS,
                                 {sid: TABLES[sid]}, **kw)  # fmt: skip


def _run(worker, groups):
    """Execute one step; append each sampled token to its sequence; {seq_id: token}."""
    out = worker.execute_model(ExecuteModelRequest(groups))
    tokens = {}
    for md, o in zip(groups, out.outputs):
        assert len(o.samples) == (1 if md.do_sample else 0), md.request_id
        for s in o.samples:
            md.seq_data[s.parent_seq_id].append_token_id(s.output_token, 0.0)
            tokens[s.parent_seq_id] = s.output_token
    return tokens


@pytest.mark.forked
@pytest.mark.parametrize("backend", ["TORCH_SDPA", "FLASHINFER"])
def test_mixed_steps_run_eagerly_and_decode_steps_replay(tiny_llama_dir, backend):
    kw = dict(max_num_seqs=8, enable_chunked_prefill=True, max_num_batched_tokens=64,
              prefill_graph_max_tokens=0)  # fmt: skip
    g = make_worker(tiny_llama_dir, 1, backend, **kw)
    ref = make_worker(tiny_llama_dir, 1, backend, capture=False, max_num_seqs=8)
    d, r = _data(), _data()
    # Chunked: "a" in two chunks (12 + 8 tokens) while "b" and "c" prefill, then decode.
    step1 = _run(g, [_md(0, d, True, token_chunk_size=12, do_sample=False),
                     _md(1, d, True), _md(2, d, True)])  # fmt: skip
    step2 = _run(g, [_md(0, d, True, token_chunk_size=8, computed_lens={0: 12}),
                     _md(1, d, False), _md(2, d, False)])  # fmt: skip
    step3 = _run(g, [_md(s, d, False) for s in (0, 1, 2)])
    # Unchunked reference: one prefill of all three, then decodes.
    ref1 = _run(ref, [_md(s, r, True) for s in (0, 1, 2)])
    ref2 = _run(ref, [_md(s, r, False) for s in (0, 1, 2)])
    ref3 = _run(ref, [_md(1, r, False), _md(2, r, False)])
    assert step1 == {1: ref1[1], 2: ref1[2]}
    assert step2 == {0: ref1[0], 1: ref2[1], 2: ref2[2]}
    assert step3 == {0: ref2[0], 1: ref3[1], 2: ref3[2]}
    snap = g.model_runner.counters.snapshot()
    assert snap["eager"] == {0: {"prefill": 1, "mixed": 1}}, snap
    assert snap["graph"] == {0: {4: 1}}, snap  # 3 decode rows padded to the graph of 4
    gr = g.model_runner.graph_runner
    assert gr._use_captured_graph(0, 3, 20) and gr.captured_sizes(0) == [1, 2, 4, 8]
    if backend == "FLASHINFER":  # the mixed step planned the prefill wrapper
        assert g.model_runner.attn_backend.prefill_runs == 2
