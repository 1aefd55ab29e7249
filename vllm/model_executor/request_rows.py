"""Per-request sampling values: what every sample row of one request gets, computed once.

:meth:`vllm.model_executor.sampling_metadata.SamplingMetadata.build` lays out rows every
step; the values a row takes from its request's SamplingParams (temperature, filters,
penalties, the stop ids min_tokens masks, logprob counts) do not change while the request
lives, so they are derived once and kept on the params object (see :func:`request_rows`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from vllm.sampling_params import SamplingParams


@dataclass(frozen=True)
class RequestRows:
    """What every sample row of one request gets, derived from its SamplingParams once.

    ``temperature`` is 1 for greedy rows; ``top_k`` is a float, ``vocab_size`` for "off";
    ``penalties`` is (presence, frequency, repetition); ``min_tokens_stops`` the sorted stop
    ids (EOS and stop_token_ids) inside the vocabulary that min_tokens masks, empty when
    min_tokens is 0 or there are none; ``logit_bias`` the (token id, bias) pairs and
    ``allowed_token_ids`` the allowed ids (None: all), both inside the vocabulary;
    ``bad_words`` the banned token sequences (vllm/bad_words.py), whose banned tokens
    depend on the tokens generated so far and are found per row and step in ``build``.
    """

    vocab_size: int
    greedy: bool
    temperature: float
    top_p: float
    top_k: float
    min_p: float
    filtered: bool  # a random row that uses top-k, top-p or min-p
    seeded: bool  # a random row with its own generator
    penalties: tuple[float, float, float]
    penalized: bool
    min_tokens: int
    min_tokens_stops: list[int]
    logprobs: int
    prompt_logprobs: int
    logit_bias: tuple[tuple[int, float], ...]
    allowed_token_ids: tuple[int, ...] | None
    bad_words: tuple[tuple[int, ...], ...]
    biased: bool  # logit_bias, allowed_token_ids or bad_words set: the row gets a bias row
    plain: bool  # greedy, and none of the above: its rows need nothing but the layout


# Attribute of a SamplingParams holding its RequestRows (see request_rows).
CACHE_ATTR = "_sampling_rows"


def request_rows(p: SamplingParams, vocab_size: int) -> RequestRows:
    """``p``'s per-row values, computed on first use and kept on ``p``.

    Sound because the engine clones the params of every request and never changes them
    once the request is queued (``all_stop_token_ids`` gets EOS before that), so a cached
    value cannot go stale; it is keyed by ``vocab_size`` as well. Nothing in it depends
    on a sequence's progress: min_tokens is checked per row and step in ``build``.
    """
    cached = p.__dict__.get(CACHE_ATTR)
    if cached is not None and cached.vocab_size == vocab_size:
        return cached
    if (  # the common case, checked first: a worker process gets new params every step
        p.greedy
        and not p.logprobs
        and not p.prompt_logprobs
        and not p.min_tokens
        and p.presence_penalty == 0.0
        and p.frequency_penalty == 0.0
        and p.repetition_penalty == 1.0
        and p.top_k == -1
        and p.top_p == 1.0
        and p.min_p == 0.0
        and p.logit_bias is None
        and p.allowed_token_ids is None
        and not p.bad_words_token_ids
    ):
        rows = _plain_rows(vocab_size)
    else:
        rows = _compute_rows(p, vocab_size)
    p.__dict__[CACHE_ATTR] = rows
    return rows


@functools.lru_cache(maxsize=8)
def _plain_rows(vocab_size: int) -> RequestRows:
    """The values of a greedy request with every other option at its default."""
    return _compute_rows(SamplingParams(temperature=0.0), vocab_size)


def _compute_rows(p: SamplingParams, vocab_size: int) -> RequestRows:
    greedy = p.greedy
    pen = (p.presence_penalty, p.frequency_penalty, p.repetition_penalty)
    stops = p.all_stop_token_ids
    min_tokens_stops = sorted(t for t in stops if 0 <= t < vocab_size) if p.min_tokens else []
    logprobs, prompt_logprobs = p.logprobs or 0, p.prompt_logprobs or 0
    bias = tuple((t, b) for t, b in (p.logit_bias or {}).items() if t < vocab_size)
    allowed = None
    if p.allowed_token_ids is not None:
        allowed = tuple(sorted({t for t in p.allowed_token_ids if t < vocab_size}))
    bad_words = tuple(tuple(s) for s in p.bad_words_token_ids if s[-1] < vocab_size)
    biased = bool(bias) or allowed is not None or bool(bad_words)
    return RequestRows(
        vocab_size=vocab_size,
        greedy=greedy,
        temperature=1.0 if greedy else p.temperature,
        top_p=p.top_p,
        top_k=float(p.top_k if p.top_k > 0 else vocab_size),
        min_p=p.min_p,
        filtered=not greedy and (p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0.0),
        seeded=p.seed is not None and not greedy,
        penalties=pen,
        penalized=pen != (0.0, 0.0, 1.0),
        min_tokens=p.min_tokens,
        min_tokens_stops=min_tokens_stops,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        logit_bias=bias,
        allowed_token_ids=allowed,
        bad_words=bad_words,
        biased=biased,
        plain=greedy
        and pen == (0.0, 0.0, 1.0)
        and not min_tokens_stops
        and not logprobs
        and not prompt_logprobs
        and not biased,
    )
