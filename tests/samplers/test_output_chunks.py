"""Multi-token chunks (multi-step decoding, speculation) on the host: the chunk path of
``output_processor.append_samples`` (requests without stop strings: appended up to the
first stopping token, one stop check) against the one-token-at-a-time reference on random
cases, and ``sampler.unpack_samples``'s row layout over several steps."""

import pickle
import random

import pytest

from vllm.engine.output_processor import append_samples
from vllm.engine.stop_checker import check_stop
from vllm.model_executor.layers.sampler import _position, unpack_samples
from vllm.sampling_params import SamplingParams
from vllm.sequence import (
    CompletionSequenceGroupOutput,
    Logprob,
    Sequence,
    SequenceGroup,
    SequenceOutput,
    SequenceStatus,
)

EOS = 2
PROMPT = [5, 6, 7]


def _random_params(rng: random.Random) -> SamplingParams:
    max_tokens = rng.choice([None, rng.randint(1, 12)])
    min_tokens = rng.randint(0, max_tokens or 6)
    return SamplingParams(
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=rng.random() < 0.3,
        stop_token_ids=rng.sample(range(3, 9), rng.randint(0, 2)),
    )


def _random_chunks(rng: random.Random) -> list[list[tuple[int, dict]]]:
    """Chunks of 1-8 (token, logprobs) pairs; tokens drawn so EOS and stop ids occur; a
    few positions whose dict lacks the token (counted as logprob 0)."""
    chunks = []
    for _ in range(rng.randint(1, 4)):
        chunk = []
        for _ in range(rng.randint(1, 8)):
            t = rng.randint(2, 12)
            key = t if rng.random() > 0.1 else t + 100
            chunk.append((t, {key: Logprob(-rng.random() * 7, rng.randint(1, 4))}))
        chunks.append(chunk)
    return chunks


def _reference(params: SamplingParams, chunks, max_model_len: int) -> Sequence:
    seq = Sequence(0, None, PROMPT, 16, eos_token_id=EOS)
    for chunk in chunks:
        for token, lps in chunk:
            if seq.is_finished():
                break
            seq.append_token_id(token, lps)
            check_stop(seq, 0, params, max_model_len)
    return seq


def _state(seq: Sequence) -> tuple:
    return (seq.output_token_ids, seq.token_logprobs, seq.data.cumulative_logprob,
            seq.status, seq.stop_reason)  # fmt: skip


@pytest.mark.parametrize("keep_logprobs", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_chunks_equal_one_token_at_a_time(seed, keep_logprobs):
    """Same tokens, logprobs, cumulative logprob (bit for bit), status and stop reason
    as the per-token loop, over 300 random requests (EOS with and without ignore_eos,
    stop ids, min_tokens, max_tokens, max_model_len). A sequence that does not keep its
    logprobs dicts (a request without ``logprobs``) has the same chosen-token logprobs
    and cumulative logprob, and no dicts."""
    rng = random.Random(seed)
    reasons = set()
    length_only = 0  # requests only a length can stop (tokens_until_stop's shortcut)
    for _ in range(300):
        params = _random_params(rng)
        length_only += params.ignore_eos and not params.stop_token_ids
        chunks = _random_chunks(rng)
        max_model_len = rng.choice([len(PROMPT) + rng.randint(1, 10), 4096])
        seq = Sequence(0, None, PROMPT, 16, eos_token_id=EOS, keep_logprobs=keep_logprobs)
        group = SequenceGroup("r", [seq], params, 0.0)
        for chunk in chunks:
            out = SequenceOutput(seq.seq_id, chunk[0][0], chunk[0][1], chunk[1:] or None)
            append_samples(group, CompletionSequenceGroupOutput([out]), None, max_model_len)
        want = _reference(params, chunks, max_model_len)
        assert _state(seq) == _state(want), (params, chunks, max_model_len)
        assert seq.output_logprobs == (want.output_logprobs if keep_logprobs else [])
        # the reference keeps one dict per token, and token_logprobs reads each one
        assert len(want.output_logprobs) == len(want.output_token_ids)
        assert want.token_logprobs == [
            lps[t].logprob if t in lps else 0.0
            for t, lps in zip(want.output_token_ids, want.output_logprobs)
        ]
        reasons.add((seq.status, seq.stop_reason is not None))
    assert length_only >= 20
    # the cases reached every way to end (and not ending at all)
    assert {
        (SequenceStatus.FINISHED_STOPPED, False),  # EOS
        (SequenceStatus.FINISHED_STOPPED, True),  # a stop token id
        (SequenceStatus.FINISHED_LENGTH_CAPPED, False),
    } <= reasons
    assert any(status == SequenceStatus.RUNNING or status == SequenceStatus.WAITING
               for status, _ in reasons)  # fmt: skip


def test_unpacked_rows_without_top_logprobs_equal_position():
    """Groups of two rows, of one row with two top logprobs, of no sampled row and of one
    row, over three steps: each sequence gets its own row of every step, in order (its
    token and dict equal ``_position`` of that packed row, also in a pickled copy taken
    before any dict was built); the non-sampling group none."""
    rng = random.Random(0)
    k = 2
    layout = [([10, 11], 0, True), ([12], 2, True), ([13], 0, False), ([14], 0, True)]
    rows = 4  # sampled rows: 10, 11, 12, 14
    steps = [
        [[float(rng.randint(0, 99)), -rng.random(), float(rng.randint(1, 5)),
          -0.1, -0.2, float(rng.randint(0, 99)), float(rng.randint(0, 99))]
         for _ in range(rows)]
        for _ in range(3)
    ]  # fmt: skip
    out = unpack_samples(layout, steps, k, {})
    samples = [s for g in out.outputs for s in g.samples]
    assert [s.parent_seq_id for s in samples] == [10, 11, 12, 14]
    assert out.outputs[2].samples == []
    for row, (s, n) in enumerate(zip(samples, [0, 0, 2, 0])):
        copy = pickle.loads(pickle.dumps(s))  # taken before any dict is built
        want = [_position(step[row], n, k) for step in steps]
        assert s.token_ids == [t for t, _ in want]
        assert s.token_logprobs == [step[row][1] for step in steps]
        # a copy through pickle (a worker process's reply) reads the same
        for out in (s, copy):
            assert [(out.output_token, out.logprobs), *out.extra_tokens] == want


@pytest.mark.parametrize("seed", range(2))
def test_deferred_text_equals_inline_text(seed, tiny_llama_dir):
    """Async output processing's split (``append_samples(defer_text=True)``, then
    ``finish_text_of``) gives the text, tokens and stop state that detokenizing inline
    gives, after every step: one-token and multi-token steps, stops by EOS, stop ids and
    length, with and without ``include_stop_str_in_output``, and tokens whose bytes form
    a character only together (SmolLM2's byte-level vocabulary)."""
    from transformers import AutoTokenizer

    from vllm.engine.output_processor import finish_text_of

    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    eos = tok.eos_token_id
    rng = random.Random(seed)
    # byte tokens of "é" and "😀" (2 and 4 bytes) among ordinary ones
    pool = list(range(300, 3000, 97)) + tok.encode("é😀 a") + [eos]
    deferred_seen = 0
    for _ in range(60):
        params = SamplingParams(
            max_tokens=rng.randint(1, 20),
            ignore_eos=rng.random() < 0.3,
            stop_token_ids=rng.sample(pool, rng.randint(0, 2)),
            include_stop_str_in_output=rng.random() < 0.5,
        )
        seqs = [Sequence(i, None, PROMPT, 16, eos_token_id=eos) for i in range(2)]
        groups = [SequenceGroup(f"r{i}", [s], params, 0.0) for i, s in enumerate(seqs)]
        for _ in range(rng.randint(1, 6)):
            chunk = [(rng.choice(pool), {}) for _ in range(rng.choice([1, 1, 3, 8]))]
            for group, defer in zip(groups, (False, True)):
                seq = group.seqs[0]
                out = SequenceOutput(seq.seq_id, chunk[0][0], chunk[0][1], chunk[1:] or None)
                outs = CompletionSequenceGroupOutput([out])
                if append_samples(group, outs, tok, 4096, defer_text=defer):
                    deferred_seen += 1
                    finish_text_of(group, tok)
            a, b = seqs
            assert (a.output_text, _state(a)) == (b.output_text, _state(b)), params
    assert deferred_seen > 100
