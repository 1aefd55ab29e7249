"""The chunked-prefill scheduler (torch-free): decodes first, then contiguous prefill chunks
in the rest of the token budget, oldest first; partial-prefill limit; preemption of a partial
prefill; n > 1; prefix-cache blocks registered only once the chunk computing them is
scheduled; the budget rule of never_fits_reason.

"The model" is simulated: after each schedule() the test appends a token to every sequence
of the groups whose metadata samples (decode rows and last chunks), as the engine would.
"""

import itertools
from types import SimpleNamespace

from vllm.config import SchedulerConfig
from vllm.core.scheduler import Scheduler
from vllm.sampling_params import SamplingParams
from vllm.sequence import Logprob, Sequence, SequenceGroup, SequenceStatus

_ids = itertools.count()
BS = 4


def make_scheduler(budget=16, max_num_seqs=8, blocks=64, partial=1, caching=False, chunked=True):
    cfg = SchedulerConfig(
        max_model_len=256,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget if chunked else 256,
        enable_chunked_prefill=chunked,
        max_num_partial_prefills=partial,
    )
    cache = SimpleNamespace(block_size=BS, num_gpu_blocks=blocks, enable_prefix_caching=caching)
    return Scheduler(cfg, cache)


def make_group(rid, prompt_len, n=1, first=100):
    prompt = list(range(first, first + prompt_len))
    seqs = [Sequence(next(_ids), None, prompt, BS) for _ in range(n)]
    return SequenceGroup(rid, seqs, SamplingParams(n=n, temperature=0.0))


def step(sched, token=5):
    """schedule() and append a token to every sampling group; returns (metadata, out)."""
    meta, out = sched.schedule()
    for md, g in zip(meta, out.scheduled_seq_groups):
        if md.do_sample:
            for s in g.get_seqs(SequenceStatus.RUNNING):
                s.append_token_id(token, {token: Logprob(-0.5)})
    return meta, out


def summary(meta):
    """(request, is_prompt, chunk start, chunk size, do_sample) per scheduled group."""
    rows = []
    for md in meta:
        start = min(md.computed_lens.values()) if md.computed_lens else 0
        rows.append((md.request_id, md.is_prompt, start, md.token_chunk_size, md.do_sample))
    return rows


def test_long_prompt_is_prefilled_in_contiguous_chunks_and_sampled_once():
    sched = make_scheduler(budget=16)
    sched.add_seq_group(make_group("a", 40))
    seen = [summary(step(sched)[0]) for _ in range(4)]
    assert seen == [
        [("a", True, 0, 16, False)],
        [("a", True, 16, 16, False)],
        [("a", True, 32, 8, True)],
        [("a", False, 0, None, True)],  # decoding from here on
    ]
    assert sched.running[0].seqs[0].get_output_len() == 2


def test_decodes_first_then_chunks_oldest_first_within_the_budget():
    sched = make_scheduler(budget=16)
    for rid in ("d0", "d1"):
        sched.add_seq_group(make_group(rid, 3))
    step(sched)  # both prefilled whole (6 tokens)
    sched.add_seq_group(make_group("long", 30))
    sched.add_seq_group(make_group("next", 10))
    meta, out = step(sched)
    assert summary(meta) == [("long", True, 0, 14, False), ("d0", False, 0, None, True),
                             ("d1", False, 0, None, True)]  # fmt: skip
    assert (out.num_prefill_tokens, out.num_decode_tokens, out.num_batched_tokens) == (14, 2, 16)
    assert out.num_prefill_groups == 1
    meta, out = step(sched)  # the partial prefill before the waiting one
    assert summary(meta)[0] == ("long", True, 14, 14, False)
    meta, out = step(sched)  # long's last 2 tokens, then "next" gets what is left
    assert summary(meta)[:2] == [("long", True, 28, 2, True), ("next", True, 0, 10, True)]
    assert out.num_batched_tokens == 14


def test_max_num_partial_prefills_splits_the_budget():
    one = make_scheduler(budget=16, partial=1)
    two = make_scheduler(budget=16, partial=2)
    for sched in (one, two):
        sched.add_seq_group(make_group("a", 20))
        sched.add_seq_group(make_group("b", 20, first=200))
    assert summary(step(one)[0]) == [("a", True, 0, 16, False)]
    assert one.num_waiting == 1
    assert summary(step(two)[0]) == [("a", True, 0, 8, False), ("b", True, 0, 8, False)]
    assert summary(step(two)[0]) == [("a", True, 8, 8, False), ("b", True, 8, 8, False)]


def test_partial_prefill_is_preempted_and_starts_over():
    sched = make_scheduler(budget=4, blocks=6, max_num_seqs=2)
    sched.add_seq_group(make_group("d", 1))  # 1 block, a 2nd one at 5 tokens
    p = make_group("p", 20)  # 5 blocks: the cache is then full
    sched.add_seq_group(p)
    meta, _ = step(sched)
    assert summary(meta) == [("d", True, 0, 1, True), ("p", True, 0, 3, False)]
    for _ in range(3):  # d decodes (1 token) while p takes 3 tokens a step
        meta, out = step(sched)
        assert summary(meta)[1] == ("d", False, 0, None, True) and out.preempted == 0
    assert p.partial_prefill_tokens == 12
    meta, out = step(sched)  # d needs a block: the last running group (p) is preempted
    assert out.preempted == 1 and sched.num_cumulative_preemption == 1
    assert summary(meta) == [("d", False, 0, None, True)]
    assert sched.waiting[0] is p and not p.is_partial_prefill
    assert p.seqs[0].status == SequenceStatus.WAITING
    assert not sched.block_manager.has_table(p.seqs[0])


def test_n_siblings_are_chunked_together():
    sched = make_scheduler(budget=16)
    group = make_group("n3", 10, n=3)
    sched.add_seq_group(group)
    meta, out = step(sched)  # 16 // 3 = 5 tokens per sequence
    assert summary(meta) == [("n3", True, 0, 5, False)]
    assert len(meta[0].seq_data) == 3 and out.num_prefill_tokens == 15
    meta, _ = step(sched)
    assert summary(meta) == [("n3", True, 5, 5, True)]
    assert meta[0].computed_lens == {s.seq_id: 5 for s in group.seqs}
    assert [s.get_output_len() for s in group.seqs] == [1, 1, 1]


def test_prefix_cache_registers_a_chunk_blocks_when_it_is_scheduled():
    """A block is findable in the prefix cache only once the chunk that writes it is
    scheduled: registering the whole prompt at admission would let another request read
    keys that no step has written yet."""
    sched = make_scheduler(budget=8, caching=True)
    group = make_group("a", 20)
    prompt = list(group.prompt_token_ids)
    sched.add_seq_group(group)
    bm = sched.block_manager
    step(sched)
    assert bm.num_cached_prefix_tokens(prompt) == 8  # blocks 0-1 (tokens 0..7)
    step(sched)
    assert bm.num_cached_prefix_tokens(prompt) == 16  # at most (20 - 1) // 4 blocks
    step(sched)
    # A second request with the same prompt starts its chunk after the cached part.
    sched.add_seq_group(make_group("b", 20))
    meta, _ = step(sched)
    assert summary(meta)[0] == ("b", True, 16, 4, True)


def test_budget_refusal_only_without_chunking():
    chunked = make_scheduler(budget=16)
    assert chunked.never_fits_reason([200]) is None
    assert chunked.never_fits_reason([60] * 3) is None
    plain = make_scheduler(chunked=False)
    reason = plain.never_fits_reason([200, 200])
    assert reason is not None and "max_num_batched_tokens=256" in reason
    assert "max_model_len=256" in chunked.never_fits_reason([300])


def test_prompt_token_count_is_once_per_request_with_the_cached_part():
    """``num_prompt_tokens`` (vllm:prompt_tokens_total): each request's prompt once, whatever
    its n, chunk by chunk, a first chunk after a prefix-cache hit counting the cached tokens
    too; ``num_prefill_tokens`` (the budget's) counts what is computed, per sequence."""
    for chunked in (True, False):
        sched = make_scheduler(budget=16, caching=True, chunked=chunked)
        sched.add_seq_group(make_group("a", 20, n=2))
        counts = []
        for _ in range(4):
            _, out = step(sched)
            counts.append((out.num_prompt_tokens, out.num_prefill_tokens))
        # chunked: 16 // 2 = 8 tokens per sequence, 8 + 8 + 4; unchunked: all 20 at once,
        # the second sequence computing only its last, partial block (4 tokens) since it
        # finds the first one's full prompt blocks
        want = [(8, 16), (8, 16), (4, 8), (0, 0)] if chunked else [(20, 24)] + [(0, 0)] * 3
        assert counts == want, (chunked, counts)
        sched.add_seq_group(make_group("b", 20))  # 16 of its 20 tokens are cached
        _, out = step(sched)
        assert (out.num_prompt_tokens, out.num_prefill_tokens) == (20, 4), chunked
