"""The logprobs of /v1/completions in OpenAI's and upstream vLLM's shapes.

``logprobs`` (OpenAI): per token its text, offset, logprob and the top-k alternatives by
text. ``prompt_logprobs`` (vLLM): per prompt token a dict token id -> {logprob, rank,
decoded_token} with that token and the top-k others; None for the first token, which
nothing predicts. ``name`` renders a token id as text (its decoded text, or
"token_id:ID" with ``return_tokens_as_token_ids``); it also gets the token's Logprob when
there is one, whose ``decoded_token`` spares decoding the token again.
"""

from __future__ import annotations

from collections.abc import Callable

from vllm.entrypoints.openai.protocol import CompletionLogProbs, PromptLogprob
from vllm.sequence import Logprob, PositionLogprobs

# The lowest logprob a response shows: a token masked out (logit -inf: allowed_token_ids,
# a grammar) has logprob -inf, which JSON cannot encode; upstream vLLM shows -9999.0.
MIN_LOGPROB = -9999.0


def top_k(ranked: list, k: int) -> list:
    """The first ``k`` of ``ranked`` (most likely first); all of it for k = -1 (vLLM's
    ``logprobs=-1``: the whole vocabulary)."""
    return ranked if k < 0 else ranked[:k]


def json_logprob(logprob: float) -> float:
    """``logprob`` for a JSON response: at least :data:`MIN_LOGPROB` (so never -inf)."""
    return max(logprob, MIN_LOGPROB)


def completion_logprobs(
    token_ids: list[int],
    positions: list[PositionLogprobs | None],
    k: int,
    start_offset: int,
    name: Callable[[int, Logprob | None], str],
) -> CompletionLogProbs:
    """OpenAI completion logprobs: the chosen token's logprob and the top-k per position
    (the chosen token included; every token for k = -1); None at a position without
    logprobs (the first prompt token). ``start_offset`` is the text offset of the first
    token."""
    out = CompletionLogProbs()
    offset = start_offset
    for tid, pos in zip(token_ids, positions):
        tok = name(tid, pos.get(tid) if pos else None)
        out.tokens.append(tok)
        out.text_offset.append(offset)
        offset += len(tok)
        if pos is None:
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            continue
        chosen = pos.get(tid)
        out.token_logprobs.append(json_logprob(chosen.logprob) if chosen is not None else None)
        ranked = sorted(pos.items(), key=lambda kv: -kv[1].logprob)
        top = {}
        for t, lp in top_k(ranked, k):
            top[name(t, lp)] = json_logprob(lp.logprob)
        if chosen is not None:
            top.setdefault(tok, json_logprob(chosen.logprob))
        out.top_logprobs.append(top)
    return out


def prompt_logprobs(
    prompt_ids: list[int],
    positions: list[PositionLogprobs | None] | None,
    k: int,
    name: Callable[[int, Logprob | None], str],
) -> list[dict[int, PromptLogprob] | None]:
    """Per prompt token: the token itself and the ``k`` most likely tokens at its position
    (rank <= k; the engine may have computed more when echo asked for more; every token for
    k = -1), each with its logprob, rank (1 = most likely) and text."""
    positions = positions or [None] * len(prompt_ids)
    out: list[dict[int, PromptLogprob] | None] = []
    for tid, pos in zip(prompt_ids, positions):
        if pos is None:
            out.append(None)
            continue
        entry = {}
        for t, lp in sorted(pos.items(), key=lambda kv: -kv[1].logprob):
            if t == tid or k < 0 or (lp.rank is not None and lp.rank <= k):
                entry[t] = PromptLogprob(
                    logprob=json_logprob(lp.logprob), rank=lp.rank, decoded_token=name(t, lp)
                )
        out.append(entry)
    return out
