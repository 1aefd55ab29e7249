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


def _random_ids_equal(tok, n=500):
    rng = random.Random(1)
    for skip in (True, False):
        params = SamplingParams(skip_special_tokens=skip)
        for _ in range(n):
            ids = [rng.randrange(len(tok)) for _ in range(rng.randint(0, 12))]
            assert decode_ids(tok, ids, params) == tok.decode(ids, skip_special_tokens=skip)


def test_tokenizers_that_clean_up_spaces_or_are_not_transformers_use_decode(tok):
    import copy

    cleaning = copy.deepcopy(tok)
    cleaning.clean_up_tokenization_spaces = True
    # transformers 5 skips the clean-up for BPE models unless told to corrupt the text
    if hasattr(cleaning, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"):
        cleaning.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output = True
    ids = cleaning.encode("a . b , c", add_special_tokens=False)
    assert cleaning.decode(ids) != cleaning.backend_tokenizer.decode(ids)  # clean-up is on
    assert _backend_decode(cleaning) is None
    _random_ids_equal(cleaning, 100)

    class Stub:
        def decode(self, ids, skip_special_tokens, spaces_between_special_tokens):
            return f"{ids}:{skip_special_tokens}:{spaces_between_special_tokens}"

    params = SamplingParams(skip_special_tokens=False, spaces_between_special_tokens=False)
    assert decode_ids(Stub(), [1, 2], params) == "[1, 2]:False:False"


def test_clean_up_flag_that_transformers_ignores_keeps_the_fast_path(tok):
    """clean_up_tokenization_spaces=True on a BPE tokenizer whose transformers skips the
    clean-up (the SmolLM2 GGUF tokenizer on the GPU host): the decode is the backend's, so
    the fast path stays, and equals tokenizer.decode."""
    import copy

    flagged = copy.deepcopy(tok)
    flagged.clean_up_tokenization_spaces = True
    ids = flagged.encode("a . b , c", add_special_tokens=False)
    if flagged.decode(ids) != flagged.backend_tokenizer.decode(ids):
        pytest.skip("this transformers version cleans up BPE text")
    assert _backend_decode(flagged) is not None
    _random_ids_equal(flagged)
