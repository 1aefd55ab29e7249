"""decode_ids calls the Rust backend directly only where that equals tokenizer.decode."""

import random

import pytest

from vllm.engine.detokenizer import _backend_decode, decode_ids
from vllm.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def tok(tiny_llama_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama_dir)


@pytest.mark.parametrize("skip", [True, False])
def test_backend_decode_equals_tokenizer_decode(tok, skip):
    assert _backend_decode(tok) is not None  # the fixtures' fast BPE tokenizer qualifies
    params = SamplingParams(skip_special_tokens=skip)
    rng = random.Random(0)
    special = tok.all_special_ids
    for _ in range(2000):
        ids = [
            rng.choice(special) if rng.random() < 0.1 else rng.randrange(len(tok))
            for _ in range(rng.randint(0, 12))
        ]
        assert decode_ids(tok, ids, params) == tok.decode(ids, skip_special_tokens=skip), ids


def test_tokenizers_that_clean_up_spaces_or_are_not_transformers_use_decode(tok):
    import copy

    cleaning = copy.deepcopy(tok)
    cleaning.clean_up_tokenization_spaces = True
    assert _backend_decode(cleaning) is None

    class Stub:
        def decode(self, ids, skip_special_tokens, spaces_between_special_tokens):
            return f"{ids}:{skip_special_tokens}:{spaces_between_special_tokens}"

    params = SamplingParams(skip_special_tokens=False, spaces_between_special_tokens=False)
    assert decode_ids(Stub(), [1, 2], params) == "[1, 2]:False:False"
