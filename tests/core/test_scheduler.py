"""Scheduler: admission limits, FIFO, decode, recompute preemption, abort, ignored prompts.

"The model" is simulated: between schedule() calls the test appends a token to every scheduled
sequence itself, as the engine would after a step.
"""

import itertools
import logging
from types import SimpleNamespace

import pytest

from vllm.core.scheduler import Scheduler, SchedulerOutputs
from vllm.sampling_params import SamplingParams
from vllm.sequence import Logprob, Sequence, SequenceGroup, SequenceStatus

_ids = itertools.count()


def make_scheduler(
    block_size=4,
    num_gpu_blocks=64,
    max_num_seqs=8,
    max_num_batched_tokens=256,
    max_model_len=256,
    num_lookahead_slots=0,
    enable_prefix_caching=False,
) -> Scheduler:
    sched_cfg = SimpleNamespace(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        num_lookahead_slots=num_lookahead_slots,
    )
    cache_cfg = SimpleNamespace(block_size=block_size, num_gpu_blocks=num_gpu_blocks,
                                enable_prefix_caching=enable_prefix_caching)  # fmt: skip
    return Scheduler(sched_cfg, cache_cfg)


def make_group(rid: str, prompt_len: int, block_size: int = 4, n: int = 1) -> SequenceGroup:
    seqs = [
        Sequence(next(_ids), None, list(range(100, 100 + prompt_len)), block_size) for _ in range(n)
    ]
    return SequenceGroup(rid, seqs, SamplingParams(n=n, temperature=0.0))


def run_model(out: SchedulerOutputs, token: int = 5) -> None:
    """Append one token to every running sequence of the scheduled groups."""
    for g in out.scheduled_seq_groups:
        for s in g.get_seqs(SequenceStatus.RUNNING):
            s.append_token_id(token, {token: Logprob(-0.5)})


def finish(group: SequenceGroup) -> None:
    for s in group.get_unfinished_seqs():
        s.status = SequenceStatus.FINISHED_STOPPED


def ids(groups) -> list[str]:
    return [g.request_id for g in groups]


def test_prefill_then_decode_fifo_and_metadata():
    sched = make_scheduler()
    groups = [make_group(f"r{i}", 3 + i) for i in range(3)]
    for g in groups:
        sched.add_seq_group(g)
    assert sched.num_waiting == 3 and sched.has_unfinished_seqs()

    meta, out = sched.schedule()
    assert ids(out.scheduled_seq_groups) == ["r0", "r1", "r2"]
    assert [m.request_id for m in meta] == ["r0", "r1", "r2"]
    assert out.num_prefill_groups == 3 and out.num_batched_tokens == 3 + 4 + 5
    assert all(m.is_prompt for m in meta)
    seq0 = groups[0].seqs[0]
    assert meta[0].seq_data == {seq0.seq_id: seq0.data}
    assert meta[0].block_tables == {seq0.seq_id: [0]}
    assert meta[2].block_tables == {groups[2].seqs[0].seq_id: [2, 3]}
    assert groups[0].metrics.first_scheduled_time is not None
    assert sched.num_running == 3 and sched.num_waiting == 0 and out.running_queue_size == 3
    assert not out.is_empty()

    run_model(out)
    meta, out = sched.schedule()
    assert ids(out.scheduled_seq_groups) == ["r0", "r1", "r2"]
    assert out.num_prefill_groups == 0 and out.num_batched_tokens == 3  # decode: rows
    assert not any(m.is_prompt for m in meta)
    assert out.preempted == 0 and out.ignored_seq_groups == []


def test_max_num_seqs_limits_admission():
    sched = make_scheduler(max_num_seqs=2)
    for i in range(3):
        sched.add_seq_group(make_group(f"r{i}", 4))
    _, out = sched.schedule()
    assert ids(out.scheduled_seq_groups) == ["r0", "r1"] and sched.num_waiting == 1
    run_model(out)
    _, out = sched.schedule()  # r2 still does not fit: decode r0, r1
    assert out.num_prefill_groups == 0 and ids(out.scheduled_seq_groups) == ["r0", "r1"]
    finish(sched.running[0])
    assert sched.free_finished_seq_groups() == ["r0"]
    _, out = sched.schedule()
    assert ids(out.scheduled_seq_groups) == ["r2"] and out.num_prefill_groups == 1


def test_n2_group_counts_two_seqs_and_takes_two_tables():
    sched = make_scheduler(max_num_seqs=3)
    g = make_group("pair", 6, n=2)
    sched.add_seq_group(g)
    sched.add_seq_group(make_group("other", 2, n=2))  # 2 + 2 seqs > 3
    meta, out = sched.schedule()
    assert ids(out.scheduled_seq_groups) == ["pair"]
    assert out.num_batched_tokens == 12
    s0, s1 = g.seqs
    assert meta[0].block_tables == {s0.seq_id: [0, 1], s1.seq_id: [2, 3]}
    assert set(meta[0].seq_data) == {s0.seq_id, s1.seq_id}
    run_model(out)
    meta, out = sched.schedule()
    assert out.num_batched_tokens == 2 and len(meta[0].seq_data) == 2
    # One sequence of the pair finishes: its blocks are freed, the group keeps running.
    s1.status = SequenceStatus.FINISHED_STOPPED
    assert sched.free_finished_seq_groups() == []
    assert not sched.block_manager.has_table(s1) and sched.block_manager.has_table(s0)
    meta, out = sched.schedule()  # "other" (2 seqs) now fits beside 1 running seq
    assert ids(out.scheduled_seq_groups) == ["other"]


def test_max_num_batched_tokens_limits_admission():
    sched = make_scheduler(max_num_batched_tokens=10, max_model_len=10)
    for i in range(3):
        sched.add_seq_group(make_group(f"r{i}", 4))
    _, out = sched.schedule()
    assert ids(out.scheduled_seq_groups) == ["r0", "r1"] and out.num_batched_tokens == 8
    _, out = sched.schedule()  # prefill comes first: r2 alone
    assert ids(out.scheduled_seq_groups) == ["r2"] and out.num_batched_tokens == 4


@pytest.mark.parametrize("caching", [False, True])
def test_cached_prefix_does_not_count_against_the_token_budget(caching):
    """Two 17-token prompts whose first 16 tokens are cached compute 1 token each: with
    caching both fit a 20-token budget in one step; without it, one per step."""
    sched = make_scheduler(max_num_batched_tokens=20, max_model_len=20,
                           enable_prefix_caching=caching)  # fmt: skip
    first = make_group("r0", 17)
    sched.add_seq_group(first)
    _, out = sched.schedule()
    assert out.num_batched_tokens == 17
    run_model(out)
    finish(first)
    sched.free_finished_seq_groups()
    for rid in ("r1", "r2"):
        sched.add_seq_group(make_group(rid, 17))
    _, out = sched.schedule()
    if caching:
        assert ids(out.scheduled_seq_groups) == ["r1", "r2"] and out.num_batched_tokens == 2
    else:
        assert ids(out.scheduled_seq_groups) == ["r1"] and out.num_batched_tokens == 17


def test_watermark_delays_admission():
    # block_size 1, 200 blocks -> watermark_blocks = int(0.01 * 200) = 2.
    sched = make_scheduler(block_size=1, num_gpu_blocks=200, max_num_batched_tokens=1000)
    sched.add_seq_group(make_group("big", 150, block_size=1))
    sched.add_seq_group(make_group("too_many", 49, block_size=1))  # 50 - 49 < 2
    _, out = sched.schedule()
    assert ids(out.scheduled_seq_groups) == ["big"] and ids(sched.waiting) == ["too_many"]

    sched2 = make_scheduler(block_size=1, num_gpu_blocks=200, max_num_batched_tokens=1000)
    sched2.add_seq_group(make_group("big", 150, block_size=1))
    sched2.add_seq_group(make_group("fits", 48, block_size=1))  # 50 - 48 = 2
    _, out = sched2.schedule()
    assert ids(out.scheduled_seq_groups) == ["big", "fits"]


def test_blocks_return_after_finishing():
    sched = make_scheduler(num_gpu_blocks=16)
    bm = sched.block_manager
    start = bm.get_num_free_gpu_blocks()
    groups = [make_group("a", 5), make_group("b", 7, n=2)]
    for g in groups:
        sched.add_seq_group(g)
    for _ in range(6):
        _, out = sched.schedule()
        for g in out.scheduled_seq_groups:
            for s in g.get_seqs(SequenceStatus.RUNNING):
                assert len(bm.get_block_table(s)) == -(-s.get_len() // 4)
        run_model(out)
    assert bm.get_num_free_gpu_blocks() < start
    for g in groups:
        finish(g)
    assert sorted(sched.free_finished_seq_groups()) == ["a", "b"]
    assert bm.get_num_free_gpu_blocks() == start and bm.usage() == 0.0
    assert not sched.has_unfinished_seqs() and sched.get_num_unfinished_seq_groups() == 0
    _, out = sched.schedule()
    assert out.is_empty()


def test_lookahead_slots_grow_decode_tables():
    sched = make_scheduler(num_lookahead_slots=3)
    g = make_group("spec", 4)
    sched.add_seq_group(g)
    _, out = sched.schedule()
    assert out.num_lookahead_slots == 0 and sched.block_manager.get_block_table(g.seqs[0]) == [0]
    run_model(out)  # len 5; decode covers 5 + 3 = 8 slots -> 2 blocks
    meta, out = sched.schedule()
    assert out.num_lookahead_slots == 3
    assert meta[0].block_tables[g.seqs[0].seq_id] == [0, 1]
    run_model(out)  # len 6 + 3 = 9 -> 3 blocks
    meta, out = sched.schedule()
    assert meta[0].block_tables[g.seqs[0].seq_id] == [0, 1, 2]


def test_preemption_by_recompute_is_exact():
    # 4 blocks of 4 tokens; two prompts of 6 tokens fill them all.
    sched = make_scheduler(num_gpu_blocks=4)
    a, b = make_group("a", 6), make_group("b", 6)
    sched.add_seq_group(a)
    sched.add_seq_group(b)
    _, out = sched.schedule()
    first_time_b = b.metrics.first_scheduled_time
    for step in range(3):  # prefill, then decode at len 7 and 8
        run_model(out, token=10 + step)
        _, out = sched.schedule()
        if step < 2:
            assert ids(out.scheduled_seq_groups) == ["a", "b"] and out.preempted == 0
    # len 9: a needs a 3rd block, none free -> b (the last running group) is preempted.
    assert ids(out.scheduled_seq_groups) == ["a"] and out.preempted == 1
    sb = b.seqs[0]
    assert sb.status == SequenceStatus.WAITING and sb.output_token_ids == [10, 11, 12]
    assert ids(sched.waiting) == ["b"] and ids(sched.running) == ["a"]
    assert not sched.block_manager.has_table(sb)
    assert sched.block_manager.get_block_table(a.seqs[0]) == [0, 1, 2]

    run_model(out, token=20)  # a: len 10; b needs 3 blocks, 1 free -> LATER, a decodes
    _, out = sched.schedule()
    assert ids(out.scheduled_seq_groups) == ["a"] and out.num_prefill_groups == 0
    finish(a)
    assert sched.free_finished_seq_groups() == ["a"]

    meta, out = sched.schedule()  # b comes back with a larger prefill: prompt + outputs
    assert ids(out.scheduled_seq_groups) == ["b"] and meta[0].is_prompt
    assert out.num_batched_tokens == 9
    assert meta[0].seq_data[sb.seq_id].get_token_ids() == [*range(100, 106), 10, 11, 12]
    assert len(meta[0].block_tables[sb.seq_id]) == 3
    assert b.metrics.first_scheduled_time == first_time_b
    run_model(out, token=30)
    meta, out = sched.schedule()  # decoding continues from the last token
    assert not meta[0].is_prompt
    assert meta[0].seq_data[sb.seq_id].get_last_token_id() == 30
    assert meta[0].seq_data[sb.seq_id].get_len() == 10
    assert len(meta[0].block_tables[sb.seq_id]) == 3


def test_several_preemptions_keep_priority_order_in_waiting():
    # 6 blocks of 2; three prompts of 4 tokens take them all; 2 lookahead slots need 2 more
    # blocks each: a preempts c, then b has nothing left to preempt and preempts itself.
    sched = make_scheduler(block_size=2, num_gpu_blocks=6, num_lookahead_slots=2)
    for rid in "abc":
        sched.add_seq_group(make_group(rid, 4, block_size=2))
    _, out = sched.schedule()
    run_model(out)
    meta, out = sched.schedule()
    assert ids(out.scheduled_seq_groups) == ["a"] and out.preempted == 2
    assert ids(sched.waiting) == ["b", "c"] and ids(sched.running) == ["a"]
    assert len(meta[0].block_tables[sched.running[0].seqs[0].seq_id]) == 4
    assert sched.num_cumulative_preemption == 2


def test_preempting_itself_then_ignored_when_it_can_never_fit(caplog):
    # A sequence that outgrows the whole cache is preempted, then ignored (no hang).
    sched = make_scheduler(num_gpu_blocks=2)
    g = make_group("grow", 8)
    sched.add_seq_group(g)
    _, out = sched.schedule()
    run_model(out)  # len 9 needs 3 blocks > 2
    _, out = sched.schedule()
    assert out.is_empty() and out.preempted == 1 and ids(sched.waiting) == ["grow"]
    with caplog.at_level(logging.WARNING, logger="vllm.core.scheduler"):
        _, out = sched.schedule()
    assert ids(out.ignored_seq_groups) == ["grow"] and out.is_empty()
    assert g.seqs[0].status == SequenceStatus.FINISHED_IGNORED
    assert "KV-cache blocks" in caplog.text
    assert not sched.has_unfinished_seqs()
    assert sched.block_manager.get_num_free_gpu_blocks() == 2


def test_prompt_needing_more_blocks_than_exist_is_ignored_beside_others():
    sched = make_scheduler(num_gpu_blocks=4)
    sched.add_seq_group(make_group("huge", 17))  # 5 blocks > 4
    sched.add_seq_group(make_group("ok", 4))
    _, out = sched.schedule()
    assert ids(out.ignored_seq_groups) == ["huge"] and ids(out.scheduled_seq_groups) == ["ok"]


@pytest.mark.parametrize("order", [(15, 17, 16), (17, 16, 15)])
def test_max_model_len_boundaries(order, caplog):
    sched = make_scheduler(max_model_len=16, max_num_batched_tokens=64)
    groups = {n: make_group(f"len{n}", n) for n in order}
    for n in order:
        sched.add_seq_group(groups[n])
    with caplog.at_level(logging.WARNING, logger="vllm.core.scheduler"):
        meta, out = sched.schedule()
    assert ids(out.ignored_seq_groups) == ["len17"]
    assert ids(out.scheduled_seq_groups) == [f"len{n}" for n in order if n != 17]
    assert len(meta) == 2
    s17 = groups[17].seqs[0]
    assert s17.status == SequenceStatus.FINISHED_IGNORED
    assert SequenceStatus.get_finished_reason(s17.status) == "length"
    assert not sched.block_manager.has_table(s17)
    assert "17 tokens" in caplog.text and "max_model_len=16" in caplog.text
    assert sched.num_waiting == 0 and sched.num_running == 2


def test_group_larger_than_token_budget_is_ignored():
    sched = make_scheduler(max_num_batched_tokens=8, max_model_len=8)
    sched.add_seq_group(make_group("pair", 5, n=2))  # 10 tokens > 8: could never run
    sched.add_seq_group(make_group("ok", 8))
    _, out = sched.schedule()
    assert ids(out.ignored_seq_groups) == ["pair"] and ids(out.scheduled_seq_groups) == ["ok"]


@pytest.mark.parametrize("caching", [False, True])
def test_siblings_share_the_prompt_prefill_with_prefix_caching(caching):
    """n = 3 sequences of a 17-token prompt (block size 4) against a 24-token budget: with
    prefix caching the first computes 17 tokens and each sibling only the prompt's last
    token (its first 16 are in blocks the first one registers), 19 in all, so the group
    runs; without caching it needs 51 and can never run (ignored, and refused up front
    by the same rule). Prompt logprobs read no cache: refused either way."""
    sched = make_scheduler(max_num_batched_tokens=24, max_model_len=24,
                           enable_prefix_caching=caching)  # fmt: skip
    group = make_group("n3", 17, n=3)
    reason = sched.never_fits_reason([17] * 3, shared_prefix=17)
    sched.add_seq_group(group)
    _, out = sched.schedule()
    if caching:
        assert reason is None
        assert ids(out.scheduled_seq_groups) == ["n3"] and out.num_batched_tokens == 19
        tables = [sched.block_manager.get_block_table(s) for s in group.seqs]
        assert tables[1][:4] == tables[2][:4] == tables[0][:4]  # the 16 shared tokens
        assert len({t[4] for t in tables}) == 3  # each its own last block
    else:
        assert "prefill of 51 tokens" in reason and "max_num_batched_tokens=24" in reason
        assert ids(out.ignored_seq_groups) == ["n3"] and not out.scheduled_seq_groups
    assert "prefill of 51 tokens" in sched.never_fits_reason([17] * 3, shared_prefix=0)


@pytest.mark.parametrize("caching", [False, True])
def test_siblings_count_the_shared_prompt_blocks_once(caching):
    """n = 2 sequences of a 17-token prompt (block size 4) in a 6-block cache: each needs 5
    blocks, but with prefix caching the second shares the first's 4 full prompt blocks, so
    the group takes 6 blocks and runs; without caching it needs 10: refused up front and
    ignored. The free count after admission shows the sharing."""
    sched = make_scheduler(num_gpu_blocks=6, enable_prefix_caching=caching)
    sched.block_manager.watermark_blocks = 0
    group = make_group("n2", 17, n=2)
    reason = sched.never_fits_reason([17] * 2, shared_prefix=17)
    assert sched.block_manager.blocks_needed([17, 17], 17) == (6 if caching else 10)
    sched.add_seq_group(group)
    _, out = sched.schedule()
    if caching:
        assert reason is None and ids(out.scheduled_seq_groups) == ["n2"]
        assert sched.block_manager.get_num_free_gpu_blocks() == 0
    else:
        assert "needs more KV-cache blocks (10) than the 6 blocks" in reason
        assert ids(out.ignored_seq_groups) == ["n2"]
    # prompt logprobs read no cache, so nothing is shared: 10 blocks either way
    assert sched.block_manager.blocks_needed([17, 17], 0) == 10


def test_abort_frees_blocks_in_both_queues():
    sched = make_scheduler(num_gpu_blocks=8, max_num_seqs=2)
    groups = [make_group(f"r{i}", 8) for i in range(3)]
    for g in groups:
        sched.add_seq_group(g)
    _, out = sched.schedule()
    assert sched.block_manager.get_num_free_gpu_blocks() == 4
    sched.abort_seq_group("r0")
    assert sched.block_manager.get_num_free_gpu_blocks() == 6
    assert groups[0].seqs[0].status == SequenceStatus.FINISHED_ABORTED
    sched.abort_seq_group(["r2", "unknown"])  # waiting one
    assert groups[2].seqs[0].status == SequenceStatus.FINISHED_ABORTED
    assert ids(sched.running) == ["r1"] and sched.num_waiting == 0
    assert sched.free_finished_seq_groups() == ["r0", "r2"]
    assert sched.free_finished_seq_groups() == []
    sched.abort_seq_group("r1")
    assert sched.block_manager.get_num_free_gpu_blocks() == 8
    assert not sched.has_unfinished_seqs()


def test_decode_skips_finished_groups_until_freed():
    sched = make_scheduler()
    a, b = make_group("a", 4), make_group("b", 4)
    sched.add_seq_group(a)
    sched.add_seq_group(b)
    _, out = sched.schedule()
    run_model(out)
    finish(a)
    _, out = sched.schedule()
    assert ids(out.scheduled_seq_groups) == ["b"]
    assert sched.free_finished_seq_groups() == ["a"]


def test_num_gpu_blocks_must_be_set():
    sched_cfg = SimpleNamespace(
        max_num_seqs=1, max_num_batched_tokens=8, max_model_len=8, num_lookahead_slots=0
    )
    with pytest.raises(ValueError, match="num_gpu_blocks must be set"):
        Scheduler(sched_cfg, SimpleNamespace(block_size=4, num_gpu_blocks=None))


def test_real_config_classes_drive_the_scheduler():
    config = pytest.importorskip("vllm.config")
    cache = config.CacheConfig(block_size=4)
    cache.num_gpu_blocks = 8
    sched = Scheduler(config.SchedulerConfig(max_model_len=32, max_num_seqs=4), cache)
    sched.add_seq_group(make_group("r", 5))
    meta, out = sched.schedule()
    assert ids(out.scheduled_seq_groups) == ["r"] and meta[0].block_tables == {
        sched.running[0].seqs[0].seq_id: [0, 1]
    }
