"""bad_words: which token sequences a word bans (with and without a leading space), which
tokens are banned after a given output, the -inf entries of a row's bias, and multi-step
decoding falling back to one step for multi-token words."""

import pytest
import torch

from vllm.bad_words import bad_words_token_ids, banned_tokens
from vllm.model_executor.request_rows import request_rows
from vllm.model_executor.sampling_metadata import _bias_rows
from vllm.sampling_params import SamplingParams
from vllm.sequence import SequenceData, SequenceGroupMetadata
from vllm.worker.multi_step import decode_steps

VOCAB = {"Paris": [10], " Paris": [11], "New York": [20, 21], " New York": [22, 21],
         "ab": [30, 31], " ab": [30, 31, 32], "x": [40], " x": [40]}  # fmt: skip


def _encode(text):
    return list(VOCAB[text])


def test_each_word_bans_its_sequences_with_and_without_a_space():
    got = bad_words_token_ids(["Paris", " New York", "ab", "x"], _encode)
    # " ab" has a different length and " x" the same first token: only the bare form
    assert got == [[10], [11], [20, 21], [22, 21], [30, 31], [40]]


def test_banned_tokens_after_the_output_so_far():
    seqs = [[10], [20, 21], [5, 6, 7]]
    assert banned_tokens(seqs, []) == [10]
    assert banned_tokens(seqs, [3, 20]) == [10, 21]
    assert banned_tokens(seqs, [20, 3]) == [10]
    assert banned_tokens(seqs, [5, 6]) == [10, 7]
    assert banned_tokens(seqs, [6]) == [10]


def _params(seqs):
    p = SamplingParams(temperature=0.0, bad_words=["w"])
    p.bad_words_token_ids = seqs
    return p


def test_bias_row_is_minus_inf_at_the_banned_tokens():
    rows = [request_rows(_params([[7], [3, 4], [2, 99]]), 10), request_rows(_params([]), 10)]
    assert rows[0].biased and not rows[0].plain and rows[0].bad_words == ((7,), (3, 4))
    data = [SequenceData([1, 2], [3]), SequenceData([1], [3])]
    bias = _bias_rows(rows, data, 10, torch.device("cpu"))
    assert torch.isinf(bias[0]).nonzero().flatten().tolist() == [4, 7]
    assert not torch.isinf(bias[1]).any()
    bias = _bias_rows(rows[:1], [SequenceData([1], [4])], 10, torch.device("cpu"))
    assert torch.isinf(bias[0]).nonzero().flatten().tolist() == [7]


@pytest.mark.parametrize("seqs, steps", [([[7]], 4), ([[7], [3, 4]], 1)])
def test_multi_token_words_decode_one_step_at_a_time(seqs, steps):
    md = SequenceGroupMetadata.__new__(SequenceGroupMetadata)
    md.sampling_params = _params(seqs)
    md.sampling_params.max_tokens = 16
    md.seq_data = {0: SequenceData([1, 2], [3])}
    assert decode_steps([md], 4, 512) == steps


def test_bad_words_are_validated():
    with pytest.raises(ValueError, match="bad_words must be non-empty strings, got ' '"):
        SamplingParams(bad_words=[" "])
    assert SamplingParams(bad_words="Paris").bad_words == ["Paris"]
