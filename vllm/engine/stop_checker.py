"""Stop conditions, applied after every appended token (upstream vLLM's order).

1. ``min_tokens`` not yet generated: only the length limits can stop the sequence, and
   the end-of-sequence token of a structured-output request (its grammar completed
   before ``min_tokens``; the sampler lets that token through only then).
2. EOS (unless ``ignore_eos``), then ``stop_token_ids``: FINISHED_STOPPED with
   ``stop_reason`` None for EOS and the token id for a stop token. The token stays in
   ``token_ids``; its text is left out of the output text unless
   ``include_stop_str_in_output``.
3. Stop strings, searched only where they could end in the text added by this token.
   The text is cut before the string, or after it with ``include_stop_str_in_output``;
   ``stop_reason`` is the string. Token ids and logprobs are cut at the same place for
   both settings: the token whose text completes the stop string (the first token ``k``
   such that ``decode(ids[:k+1])`` holds the whole string) is the last one kept; tokens
   after it are dropped with their logprobs (they can exist when the detokenizer held
   text back for an incomplete UTF-8 character), and ``cumulative_logprob`` is reduced
   accordingly. So ``token_ids`` always contain the stop string's tokens, while the text
   contains the string only with ``include_stop_str_in_output``.
4. ``max_model_len`` reached (prompt + output), then ``max_tokens``:
   FINISHED_LENGTH_CAPPED, ``stop_reason`` None. Text held back for an incomplete
   character that a later token completed is searched for stop strings as well; a
   character still incomplete at the end is dropped (see ``finish_text``).

A finished sequence not stopped by a string gets its text from a one-shot decode
(:func:`vllm.engine.detokenizer.finish_text`), so the text equals what
``tokenizer.decode(skip_special_tokens=...)`` of the prompt's last tokens grows by when the
token_ids follow them (minus the stop token's text and a trailing incomplete character).
"""

from __future__ import annotations

from vllm.engine.detokenizer import finish_text, prompt_context, stable_text
from vllm.sampling_params import SamplingParams
from vllm.sequence import Sequence, SequenceStatus


def check_stop(
    seq: Sequence,
    new_chars: int,
    params: SamplingParams,
    max_model_len: int,
    tokenizer=None,
) -> None:
    """Set ``seq.status`` (and ``stop_reason``, final text, cut tokens) when it ends.

    Args:
        seq: the sequence, with its new token appended and its text updated.
        new_chars: characters the new token added to ``seq.output_text``.
        params: its sampling params.
        max_model_len: the engine's context limit in tokens.
        tokenizer: the tokenizer when the request is detokenized, else None.
    """
    data = seq.data  # read directly: this runs for every generated token
    out_ids = data.output_token_ids
    out_len = len(out_ids)
    can_stop = out_len >= params.min_tokens
    last = out_ids[-1] if out_ids else data.prompt_token_ids[-1]
    if not can_stop and params.guided_decoding is not None:
        can_stop = last == seq.eos_token_id  # the grammar's end (see the module docstring)
    if can_stop:
        eos = seq.eos_token_id
        is_eos = eos is not None and last == eos
        if (is_eos and not params.ignore_eos) or last in params.stop_token_ids:
            seq.status = SequenceStatus.FINISHED_STOPPED
            seq.stop_reason = None if is_eos and not params.ignore_eos else last
            if tokenizer is not None:
                drop = not params.include_stop_str_in_output
                finish_text(tokenizer, seq, params, drop_last=drop)
            return
        if params.stop and _check_stop_strings(seq, new_chars, params, tokenizer):
            return
    max_tokens = params.max_tokens
    capped = out_len + len(data.prompt_token_ids) >= max_model_len or (
        max_tokens is not None and out_len >= max_tokens
    )
    if not capped:
        return
    seq.status = SequenceStatus.FINISHED_LENGTH_CAPPED
    if tokenizer is not None:
        added = finish_text(tokenizer, seq, params, drop_last=False)
        if can_stop and params.stop and added > 0:
            _check_stop_strings(seq, added, params, tokenizer)


def tokens_until_stop(
    seq: Sequence, tokens: tuple[int, ...] | list[int], params: SamplingParams, max_model_len: int
) -> int:
    """How many of ``tokens`` (to be appended to ``seq`` in order) to append: up to and
    including the first one at which :func:`check_stop` would end the sequence, else all.

    Only for requests without stop strings: :func:`check_stop` then stops at a token only
    by its id (EOS unless ``ignore_eos``, ``stop_token_ids``; both once ``min_tokens`` are
    out) or by the length limits (``max_model_len`` for prompt + output, ``max_tokens``),
    and changes nothing at the tokens before, so appending that many and calling
    :func:`check_stop` once gives the per-token result.
    """
    data = seq.data
    eos = None if params.ignore_eos else seq.eos_token_id
    stops, min_tokens = params.stop_token_ids, params.min_tokens
    cap = max_model_len - len(data.prompt_token_ids)  # the output length reaching the limit
    if params.max_tokens is not None:
        cap = min(cap, params.max_tokens)
    n = len(data.output_token_ids)
    if eos is None and not stops:  # only the length can stop it: at the cap, else never
        return min(len(tokens), max(1, cap - n))
    guided = params.guided_decoding is not None
    for j, token in enumerate(tokens):
        n += 1  # the output length with this token
        if n >= cap or (n >= min_tokens and (token == eos or token in stops)):
            return j + 1
        if guided and token == eos:  # a grammar's end before min_tokens (check_stop)
            return j + 1
    return len(tokens)


def _check_stop_strings(seq: Sequence, new_chars: int, params: SamplingParams, tokenizer) -> bool:
    """Find the earliest stop string that ends in the last ``new_chars`` characters."""
    if new_chars <= 0:
        return False
    text = seq.output_text
    old_len = len(text) - new_chars
    best: tuple[int, str] | None = None
    for s in params.stop:
        i = text.find(s, max(0, old_len - len(s) + 1))
        if i != -1 and (best is None or i < best[0]):
            best = (i, s)
    if best is None:
        return False
    i, s = best
    end = i + len(s)
    if tokenizer is not None:
        _cut_tokens_after(seq, end, params, tokenizer)
    seq.output_text = text[:end] if params.include_stop_str_in_output else text[:i]
    seq.status = SequenceStatus.FINISHED_STOPPED
    seq.stop_reason = s
    return True


def _cut_tokens_after(seq: Sequence, end: int, params: SamplingParams, tokenizer) -> None:
    """Drop the tokens after the one whose text reaches character ``end``."""
    ids = seq.output_token_ids
    keep = len(ids)
    ctx = prompt_context(tokenizer, seq, params)
    while keep > 1 and len(stable_text(tokenizer, ids[: keep - 1], params, ctx)) >= end:
        keep -= 1
    if keep == len(ids):
        return
    for pos in range(keep, len(ids)):
        seq.data.cumulative_logprob -= seq.token_logprobs[pos]
    seq.num_cut_tokens += len(ids) - keep
    del seq.data.output_token_ids[keep:]
    del seq.token_logprobs[keep:]
    del seq.output_logprobs[keep:]
