"""SamplingMetadata.build: row layout, the per-request cache of sampling values, and the
cases where a cached value must not go stale (min_tokens running out, preemption by
recompute, n > 1 sequences finishing one by one, another vocabulary size)."""

import torch

from vllm.model_executor.sampling_metadata import SamplingMetadata
from vllm.sampling_params import SamplingParams
from vllm.sequence import SequenceData, SequenceGroupMetadata

CPU = torch.device("cpu")


def _md(rid, params, seqs, is_prompt=False):
    """seqs: [(seq_id, prompt_ids, output_ids)]."""
    data = {sid: SequenceData(list(p), list(o)) for sid, p, o in seqs}
    return SequenceGroupMetadata(rid, is_prompt, data, params, {s: [] for s in data})


def _qlens(mds):
    return [d.get_len() if md.is_prompt else 1 for md in mds for d in md.seq_data.values()]


def _build(mds, vocab=32, gens=None):
    return SamplingMetadata.build(mds, _qlens(mds), vocab, CPU, {} if gens is None else gens)


def test_all_greedy_decode_needs_only_the_layout():
    params = [SamplingParams(temperature=0.0) for _ in range(3)]
    mds = [_md(str(i), p, [(i, [1, 2], [3])]) for i, p in enumerate(params)]
    sm = _build(mds)
    assert sm.selected_token_indices.tolist() == [0, 1, 2]
    assert sm.sample_row_ids.tolist() == [0, 1, 2]
    assert sm.selected_token_indices.dtype == sm.sample_row_ids.dtype == torch.long
    assert sm.all_greedy and sm.penalties is None and sm.temperature is None
    assert sm.generators == [None, None, None]
    assert sm.max_logprobs == 0 and sm.max_prompt_logprobs == 0
    assert [g.sample_rows for g in sm.groups] == [[0], [1], [2]]
    assert [g.seq_ids for g in sm.groups] == [[0], [1], [2]]


def test_prefill_layout_with_prompt_logprobs_and_mixed_values():
    greedy = SamplingParams(temperature=0.0, logprobs=2)
    hot = SamplingParams(temperature=0.5, top_k=4, prompt_logprobs=1, presence_penalty=0.5)
    mds = [
        _md("g", greedy, [(0, [5, 6, 7], [])], is_prompt=True),
        _md("h", hot, [(1, [8, 9], [])], is_prompt=True),
    ]
    sm = _build(mds, vocab=32)
    # tokens: g at 0..2, h at 3..4; h's prompt row is position 3 (predicts token 9)
    assert sm.selected_token_indices.tolist() == [2, 3, 4]
    assert sm.sample_row_ids.tolist() == [0, 2]
    assert sm.prompt_row_ids.tolist() == [1] and sm.prompt_targets.tolist() == [9]
    assert sm.groups[1].prompt_rows == [1] and sm.groups[1].prompt_token_ids == (8, 9)
    assert not sm.all_greedy and sm.need_filter
    assert sm.greedy_mask.tolist() == [True, False]
    assert sm.temperature.tolist() == [1.0, 0.5]
    assert sm.top_k.tolist() == [32.0, 4.0]
    assert sm.max_logprobs == 2 and sm.max_prompt_logprobs == 1
    assert sm.penalties.presence.tolist() == [0.0, 0.5]
    assert sm.penalties.prompt_tokens.tolist() == [[5, 6, 7], [8, 9, 32]]


def test_min_tokens_mask_follows_each_rows_progress_with_one_cached_params():
    p = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[3, 40])
    p.all_stop_token_ids.add(1)  # EOS, added by the engine
    for outputs, masked in (([], True), ([4], True), ([4, 4], False), ([4, 4, 4], False)):
        sm = _build([_md("r", p, [(0, [2], outputs)])], vocab=32)
        if masked:
            mask = sm.penalties.min_tokens_mask
            assert mask[0].nonzero().flatten().tolist() == [1, 3]  # 40 is out of vocabulary
        else:
            assert sm.penalties is None
    # A second request sharing nothing but the values: each row on its own progress.
    q = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[3])
    sm = _build([_md("a", p, [(0, [2], [4, 4])]), _md("b", q, [(1, [2], [4])])])
    assert sm.penalties.min_tokens_mask.any(dim=1).tolist() == [False, True]


def test_seeded_generators_survive_preemption_and_n_seqs_finishing():
    p = SamplingParams(temperature=1.0, seed=11, n=2, prompt_logprobs=0)
    gens: dict = {}
    first = _md("r", p, [(7, [1, 2, 3], []), (8, [1, 2, 3], [])], is_prompt=True)
    sm = _build([first], gens=gens)
    g7, g8 = gens[7], gens[8]
    assert sm.generators == [g7, g8] and sm.prompt_row_ids.tolist() == [0, 1]
    ref = torch.Generator().manual_seed(12)  # seed + index 1 in the group
    assert torch.equal(g8.get_state(), ref.get_state())
    # Sequence 7 finished; 8 goes on alone (index 0 of this step's metadata): same stream.
    sm = _build([_md("r", p, [(8, [1, 2, 3], [4])])], gens=gens)
    assert sm.generators == [g8] and gens[8] is g8
    # Preempted and recomputed: a prefill with outputs has no prompt rows, same generator.
    sm = _build([_md("r", p, [(8, [1, 2, 3], [4, 5])], is_prompt=True)], gens=gens)
    assert sm.prompt_row_ids is None and sm.generators == [g8]
    assert sm.selected_token_indices.tolist() == [4] and sm.sample_row_ids.tolist() == [0]


def test_cached_values_are_keyed_by_vocabulary_size():
    p = SamplingParams(temperature=0.7)
    assert _build([_md("r", p, [(0, [1], [])])], vocab=16).top_k.tolist() == [16.0]
    assert _build([_md("r", p, [(0, [1], [])])], vocab=64).top_k.tolist() == [64.0]
    # A clone (what the engine queues) starts without the cache and agrees with it.
    assert _build([_md("r", p.clone(), [(0, [1], [])])], vocab=64).top_k.tolist() == [64.0]


def test_step_of_partial_chunks_with_penalties_has_no_sample_rows():
    """A chunked-prefill step whose only groups are non-final chunks of penalized requests
    samples nothing: no penalty tensors (building them for zero rows raised IndexError,
    failing the step and every request in it)."""
    pen = SamplingParams(temperature=0.0, repetition_penalty=1.5, frequency_penalty=0.5)
    mds = [_md("a", pen, [(0, [5, 6, 7, 8], [])], is_prompt=True)]
    mds[0].do_sample = False
    sm = _build(mds)
    assert sm.sample_row_ids.tolist() == [] and sm.penalties is None
    assert sm.selected_token_indices.tolist() == []
    # with a decode row beside the chunk, the penalties cover that row only
    mds.append(_md("b", pen, [(1, [9, 10], [11])]))
    sm = SamplingMetadata.build(mds, [4, 1], 32, CPU, {})
    assert sm.sample_row_ids.tolist() == [0]
    assert sm.penalties.repetition.tolist() == [1.5]
    assert sm.penalties.output_tokens.tolist() == [[11]]
