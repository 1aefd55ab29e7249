"""The ``param`` of a 400: the request field the error message starts with, or None."""

import pytest

from vllm.entrypoints.openai.api_errors import param_of


@pytest.mark.parametrize(
    "message, param",
    [
        ("seed must be a 64-bit signed integer in [...], got 18446744073709551616.", "seed"),
        ("logprobs=21 is more than max_logprobs=20 (raise --max-logprobs ...).", "logprobs"),
        ("top_p must be in (0, 1], got 2.", "top_p"),
        ("n must be an integer >= 1, got 0.", "n"),
        ("The model's chat template rendered nothing.", None),  # a word, not a field
        ("guided decoding needs exactly one of json, regex, ...", None),
        ("", None),
    ],
)
def test_param_of(message, param):
    assert param_of(message) == param
