"""Incremental detokenization: text grows token by token and equals a full decode.

Window method over the output ids with two offsets: ``prefix_offset..read_offset`` are
tokens whose text was already emitted (kept as left context so that the window decodes
as the same span of the full string), ``read_offset..end`` are tokens not yet emitted.
Each step decodes ``ids[prefix_offset:read_offset]`` (``emitted``) and
``ids[prefix_offset:]`` (``window``) and appends ``window[len(emitted):]``. A window
whose decode ends in U+FFFD (an incomplete UTF-8 sequence: a multi-byte character split
across tokens) emits nothing until a later token completes it, so no text ever has to be
taken back: the text after every step is a prefix of the final text.

Until the first output token's text is emitted (``prefix_offset`` 0) both decodes start
with the last few prompt tokens (:func:`prompt_context`) and their text is cut off again,
as upstream vLLM primes its detokenizer with the prompt: a SentencePiece tokenizer
(Llama 2, Mistral, Phi-3) drops the space of a word-initial token that starts a decode,
so the output text is what the prompt's decode grows by (" world" after "Hello"), and
prompt + output text is the decode of prompt + output ids.

When the sequence finishes, :func:`finish_text` sets the text to the one-shot decode of
the output ids (with the same prompt context) without a trailing incomplete character
(:func:`stable_text`): as in upstream vLLM's incremental detokenizers, bytes of a
character the generation never completed are dropped rather than shown as U+FFFD, and the
characters completed before them are kept, so the final text is also what the stream
sent. A byte-fallback run that turns invalid (a stray continuation byte) makes
transformers decode the whole run as U+FFFDs, text already emitted included: the emitted
text then stays, the tokens after it are decoded on their own, and the final text is the
one the incremental decode makes (:func:`finish_text`).
"""

from __future__ import annotations

import functools

from vllm.sampling_params import SamplingParams
from vllm.sequence import Sequence

_REPLACEMENT = "\ufffd"


def decode_ids(tokenizer, ids: list[int], params: SamplingParams) -> str:
    """``tokenizer.decode`` with the request's special-token options.

    A fast tokenizer that transformers decodes by a plain call of its Rust backend is
    decoded by that call directly (the same string, without ~3 us of Python around it;
    this runs twice per generated token, see :func:`_backend_decode`).
    """
    try:
        backend = _backend_decode(tokenizer)
    except TypeError:  # an unhashable stand-in
        backend = None
    if backend is not None:
        return backend(ids, skip_special_tokens=params.skip_special_tokens)
    return tokenizer.decode(
        ids,
        skip_special_tokens=params.skip_special_tokens,
        spaces_between_special_tokens=params.spaces_between_special_tokens,
    )


# Text the clean-up of tokenization spaces would change (" ." -> ".", " 's" -> "'s", ...).
_CLEANUP_PROBE = "a . b , c ! d ? e 's f n't g 'm h 've i 're"


@functools.lru_cache(maxsize=16)
def _backend_decode(tokenizer):
    """The Rust tokenizer's ``decode`` when calling it equals ``tokenizer.decode``, else None.

    True for a transformers fast tokenizer whose ``decode`` and ``_decode`` are the
    library's own and that does not clean up tokenization spaces: its ``decode(ids,
    skip_special_tokens=s)`` is then ``backend_tokenizer.decode(ids, skip_special_tokens=s)``
    (``spaces_between_special_tokens`` only affects slow tokenizers). Whether the clean-up
    is in effect is not read from ``clean_up_tokenization_spaces`` alone: some transformers
    versions skip it for BPE models although the attribute is True (the SmolLM2 GGUF
    tokenizer on the GPU host), so a probe text that the clean-up would change is decoded
    both ways and must come out the same.
    """
    try:
        from transformers import PreTrainedTokenizerFast
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
    except ImportError:
        return None
    cls = type(tokenizer)
    if not (
        isinstance(tokenizer, PreTrainedTokenizerFast)
        and cls.decode is PreTrainedTokenizerBase.decode
        and cls._decode is PreTrainedTokenizerFast._decode
    ):
        return None
    backend = tokenizer.backend_tokenizer.decode
    if tokenizer.clean_up_tokenization_spaces:
        ids = tokenizer.encode(_CLEANUP_PROBE, add_special_tokens=False)
        for skip in (False, True):
            if tokenizer.decode(ids, skip_special_tokens=skip) != backend(
                ids, skip_special_tokens=skip
            ):
                return None
    return backend


def stable_text(
    tokenizer, ids: list[int], params: SamplingParams, context: list[int] | tuple = ()
) -> str:
    """The text of ``ids`` without a trailing incomplete character.

    The decode of ``ids`` less a trailing U+FFFD run, or, when longer, the decode of the
    longest ``ids[:k]`` that does not end in U+FFFD: a byte-fallback tokenizer (Llama 2,
    Mistral) decodes a run of byte tokens that ends inside a character as one U+FFFD per
    byte, the complete characters before it included (``<0xE2><0x82><0xAC><0xF0>``
    decodes as four U+FFFD, its first three tokens as "€"). The incremental decode, which
    waits while its window ends in U+FFFD, has emitted those characters.

    With ``context`` (prompt tokens, see :func:`prompt_context`) a text is what the decode
    of ``context`` grows by when the ids follow it; when it does not grow that way, the
    decode of the ids alone.
    """

    before = decode_ids(tokenizer, context, params) if context else None

    def text_of(k: int) -> str:
        text = _decode_after(tokenizer, context, ids[:k], params, before) if context else None
        return decode_ids(tokenizer, ids[:k], params) if text is None else text

    full = text_of(len(ids))
    if not full.endswith(_REPLACEMENT):
        return full
    best = full.rstrip(_REPLACEMENT)
    for k in range(len(ids) - 1, 0, -1):
        text = text_of(k)
        if not text.endswith(_REPLACEMENT):
            return text if len(text) > len(best) else best
    return best


# Prompt tokens a sequence's first output tokens are decoded after (upstream vLLM primes
# its detokenizer with at least 4 prompt tokens, as many as needed to hold whole
# characters, at most 23).
_CONTEXT_MIN, _CONTEXT_MAX = 4, 23


def prompt_context(tokenizer, seq: Sequence, params: SamplingParams) -> list[int]:
    """The last prompt tokens that ``seq``'s first output tokens are decoded after.

    The shortest tail of at least 4 tokens (the whole prompt when shorter) whose decode
    holds no U+FFFD, i.e. starts and ends on character boundaries; [] when no tail of up to
    23 tokens does (a prompt ending inside a character). Computed once per sequence and
    kept on ``seq.detok_context``.
    """
    ctx = seq.detok_context
    if ctx is not None:
        return ctx
    prompt = seq.data.prompt_token_ids
    ctx = []
    for k in range(min(_CONTEXT_MIN, len(prompt)), min(_CONTEXT_MAX, len(prompt)) + 1):
        tail = list(prompt[-k:])
        if _REPLACEMENT not in decode_ids(tokenizer, tail, params):
            ctx = tail
            break
    seq.detok_context = ctx
    return ctx


def _decode_after(tokenizer, context: list[int], ids: list[int], params, before: str) -> str | None:
    """``decode(context + ids)`` less its prefix ``before`` = ``decode(context)`` (decoded
    once by the caller for all its slices); None when the former does not start with the
    latter (a clean-up of spaces joined the two)."""
    full = decode_ids(tokenizer, list(context) + list(ids), params)
    return full[len(before) :] if full.startswith(before) else None


def decode_sequence_step(tokenizer, seq: Sequence, params: SamplingParams) -> int:
    """Append the newly decodable text of ``seq`` to ``seq.output_text``.

    Args:
        tokenizer: a transformers tokenizer.
        seq: the sequence, its new token already appended; ``prefix_offset`` and
            ``read_offset`` are advanced when text is emitted.
        params: skip_special_tokens / spaces_between_special_tokens.
    Returns:
        The number of characters appended (0 while a character is incomplete).
    """
    return _step(tokenizer, seq, params, len(seq.output_token_ids))


def _left_context(tokenizer, seq: Sequence, params: SamplingParams) -> list[int]:
    """The tokens the window ``ids[prefix_offset:]`` is decoded after: the ones
    :func:`_step` kept when it dropped text-less tokens from the window, else the prompt's
    last tokens while ``prefix_offset`` is 0, else none."""
    if seq.prefix_offset == seq.window_context_at:
        return seq.window_context
    if seq.prefix_offset == 0:  # the first text: decoded after the prompt's last tokens
        return prompt_context(tokenizer, seq, params)
    return []


def _window(tokenizer, seq: Sequence, params: SamplingParams, end: int) -> tuple[str, str]:
    """The texts of ``ids[prefix_offset:read_offset]`` and ``ids[prefix_offset:end]`` (the
    output ids, after :func:`_left_context`)."""
    ids = seq.output_token_ids
    ctx = _left_context(tokenizer, seq, params)
    if ctx:
        before = decode_ids(tokenizer, ctx, params)
        emitted = _decode_after(
            tokenizer, ctx, ids[seq.prefix_offset : seq.read_offset], params, before
        )
        window = _decode_after(tokenizer, ctx, ids[seq.prefix_offset : end], params, before)
        if emitted is not None and window is not None:
            return emitted, window
    emitted = decode_ids(tokenizer, ids[seq.prefix_offset : seq.read_offset], params)
    return emitted, decode_ids(tokenizer, ids[seq.prefix_offset : end], params)


def _step(tokenizer, seq: Sequence, params: SamplingParams, end: int) -> int:
    """:func:`decode_sequence_step` with the output ids up to ``end`` appended so far."""
    emitted, window = _window(tokenizer, seq, params, end)
    if window.endswith(_REPLACEMENT):
        return 0  # wait for the character to complete
    restarted = not window.startswith(emitted)
    if restarted:
        # The tokens that followed changed the emitted text: a byte-fallback tokenizer
        # decodes a run of byte tokens that turned invalid (a stray continuation byte) as
        # one U+FFFD per byte, characters emitted before included. That text stays; the
        # new tokens are decoded on their own (upstream vLLM restarts its decode stream).
        emitted = ""
        window = decode_ids(tokenizer, seq.output_token_ids[seq.read_offset : end], params)
        if window.endswith(_REPLACEMENT):
            return 0
    delta = window[len(emitted) :]
    seq.output_text += delta
    if delta or restarted:
        # The tokens just emitted become the next window's left context.
        seq.prefix_offset = seq.read_offset
    else:
        # Only tokens without text (skipped special tokens): later windows are decoded
        # after the tokens whose text came last, without these. A window must not start
        # at them, as a SentencePiece decode drops the space of the word it starts with;
        # nor keep them, as it would grow with every such token.
        ids = seq.output_token_ids[seq.prefix_offset : seq.read_offset]
        seq.window_context = _left_context(tokenizer, seq, params) + ids
        seq.window_context_at = seq.prefix_offset = end
    seq.read_offset = end
    return len(delta)


def finish_text(tokenizer, seq: Sequence, params: SamplingParams, drop_last: bool) -> int:
    """Set the final text of a finished sequence: the incremental decode's text, finished.

    That is the one-shot decode (after the prompt context) without a trailing incomplete
    character (see :func:`stable_text`), unless that decode holds a U+FFFD or does not
    extend the text already emitted: then (a byte run turned invalid) the incremental
    decode runs over the tokens it has not seen (:func:`_replayed_text`), so the text is
    the same whether it was streamed or made only now, and never takes back text a stream
    has sent.

    Args:
        drop_last: leave the last token's text out (a stop token, EOS or one of
            ``stop_token_ids``, when ``include_stop_str_in_output`` is False).
    Returns:
        The number of characters added to ``seq.output_text`` (may be negative when the
        stop token's own text was already emitted this step).
    """
    ids = seq.output_token_ids
    before = seq.output_text
    kept = len(ids) - 1 if drop_last else len(ids)
    text = stable_text(tokenizer, ids[:kept], params, prompt_context(tokenizer, seq, params))
    stop_text_emitted = drop_last and seq.read_offset == len(ids) and before.startswith(text)
    if _REPLACEMENT in text or not (text.startswith(before) or stop_text_emitted):
        text = _replayed_text(tokenizer, seq, params, kept)
    seq.output_text = text
    seq.prefix_offset = seq.read_offset = len(ids)
    return len(text) - len(before)


def _replayed_text(tokenizer, seq: Sequence, params: SamplingParams, end: int) -> str:
    """The incremental decode's text of ``ids[:end]``: the steps not run yet, then the
    text of the tokens still held back, less a trailing incomplete character."""
    text = seq.output_text
    if seq.read_offset > end:  # the dropped stop token's text was emitted this step
        last = decode_ids(tokenizer, seq.output_token_ids[-1:], params)
        return text[: len(text) - len(last)] if last and text.endswith(last) else text
    for k in range(seq.read_offset + 1, end + 1):
        _step(tokenizer, seq, params, k)
    emitted, window = _window(tokenizer, seq, params, end)
    tail = window.rstrip(_REPLACEMENT)
    if len(tail) > len(emitted) and tail.startswith(emitted):
        seq.output_text += tail[len(emitted) :]
    return seq.output_text
