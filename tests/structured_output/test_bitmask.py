"""The packed token bitmask: unpacking and applying it agree with a per-token reference,
on the CPU path (xgrammar's kernel) and the torch path used on other devices."""

import pytest
import torch

from vllm.model_executor.guided_decoding import bitmask as bm

VOCAB = 70  # not a multiple of 32: the last word is partly padding


def _packed(allowed: list[set[int]]) -> torch.Tensor:
    words = torch.zeros(len(allowed), bm.words_per_row(VOCAB), dtype=torch.int64)
    for r, toks in enumerate(allowed):
        for t in toks:
            words[r, t // 32] |= 1 << (t % 32)
    words = torch.where(words >= 2**31, words - 2**32, words)  # as int32 bit patterns
    return words.to(torch.int32)


ALLOWED = [{0, 5, 31, 32, 63, 69}, {1}, set(range(VOCAB)), {33, 34, 40}]


def test_unpack_matches_reference():
    got = bm.unpack_bitmask(_packed(ALLOWED), VOCAB)
    want = torch.tensor([[t in a for t in range(VOCAB)] for a in ALLOWED])
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match=r"too narrow for a vocabulary of 70 tokens"):
        bm.unpack_bitmask(_packed(ALLOWED)[:, :2], VOCAB)


@pytest.mark.parametrize("rows", [[0, 1, 2, 3], [1, 3]])
@pytest.mark.parametrize("path", ["cpu", "torch"])
def test_apply_sets_forbidden_tokens_to_minus_inf(rows, path, monkeypatch):
    logits = torch.randn(4, VOCAB)
    mask = _packed([ALLOWED[r] for r in rows])
    if path == "torch":  # the non-CPU path, run on CPU tensors
        monkeypatch.setattr(bm, "_on_cpu", lambda t: False)
    out = bm.apply_token_bitmask(logits.clone(), torch.tensor(rows), mask)
    for r in range(4):
        for t in range(VOCAB):
            forbidden = r in rows and t not in ALLOWED[r]
            assert out[r, t].item() == (float("-inf") if forbidden else logits[r, t].item())


def _matchers():
    """Two xgrammar matchers over a 70-token vocabulary: digits only, and a-c only (after
    one accepted 'a')."""
    xgr = pytest.importorskip("xgrammar")
    vocab = [str(d) for d in range(10)] + list("abcdefghij") + [f"<t{i}>" for i in range(50)]
    info = xgr.TokenizerInfo(vocab, vocab_size=VOCAB)
    compiler = xgr.GrammarCompiler(info)
    digits = xgr.GrammarMatcher(compiler.compile_regex("[0-9]+"))
    letters = xgr.GrammarMatcher(compiler.compile_regex("[a-c]+"))
    assert letters.accept_token(10)  # 'a'
    return xgr, {7: digits, 9: letters}


def _allowed(row: torch.Tensor) -> set[int]:
    return {t for t in range(VOCAB) if bool(bm.unpack_bitmask(row[None], VOCAB)[0, t])}


def test_step_masks_fill_late_and_pickle_to_packed_rows():
    """The deferred masks: rows land in sample-row order from live matchers and from their
    pickled (filled) form alike; one pickle keeps the step's sources shared."""
    import pickle

    from vllm.model_executor.guided_decoding.step_masks import (
        PackedMasks,
        PendingBitmask,
        StepMasks,
    )

    xgr, matchers = _matchers()
    live = StepMasks(matchers, VOCAB, xgr.BatchGrammarMatcher(max_threads=1))
    assert 7 in live and 8 not in live and live
    pending = PendingBitmask([(live, 9), (live, 7)], VOCAB, torch.device("cpu"))
    rows = pending.tensor()  # [2, words]
    assert rows.shape == (2, bm.words_per_row(VOCAB)) and rows.dtype == torch.int32
    assert _allowed(rows[0]) == {10, 11, 12}  # a, b, c
    assert _allowed(rows[1]) == set(range(10))
    assert pending.tensor() is rows  # filled once

    a, b = pickle.loads(pickle.dumps([live, live]))
    assert isinstance(a, PackedMasks) and a is b
    mixed = PendingBitmask([(a, 7), (live, 9)], VOCAB, torch.device("cpu")).tensor()
    assert torch.equal(mixed, rows.flip(0))


def test_a_reasoning_sequence_has_no_row_live_or_pickled():
    """A sequence still reasoning (None in the step's matchers) keeps the step constrained
    (the source is true: one decode pass) but has no masked row, before and after the
    step is pickled to another process; the other sequence's row is unchanged."""
    import pickle

    from vllm.model_executor.guided_decoding.step_masks import PackedMasks, StepMasks

    xgr, matchers = _matchers()
    live = StepMasks({**matchers, 8: None}, VOCAB, xgr.BatchGrammarMatcher(max_threads=1))
    only = StepMasks({8: None}, VOCAB, xgr.BatchGrammarMatcher(max_threads=1))
    assert live and only and 8 not in live and 8 not in only and 7 in live
    packed = pickle.loads(pickle.dumps(live))
    assert isinstance(packed, PackedMasks) and packed and 8 not in packed and 7 in packed
    assert pickle.loads(pickle.dumps(only)).by_seq == {8: None}
    out = torch.zeros((1, bm.words_per_row(VOCAB)), dtype=torch.int32)
    packed.fill([7], out, [0])
    assert _allowed(out[0]) == set(range(10))
