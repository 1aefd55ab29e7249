"""Incremental detokenization: text grows token by token and equals a full decode.

Window method: keep two offsets into the output ids. ``prefix_offset..read_offset`` is text
already emitted (kept as left context so merges and spaces decode as in the full string);
each step decodes ``prefix_offset..end`` and emits what extends past the emitted part. A
window whose decode ends in U+FFFD (an incomplete UTF-8 sequence split across tokens) emits
nothing until a later token completes it; at the end of a sequence the rest is flushed so
the text equals ``tokenizer.decode(token_ids)``.
"""

from __future__ import annotations

from vllm.sampling_params import SamplingParams
from vllm.sequence import Sequence

_REPLACEMENT = "\ufffd"


def _decode(tokenizer, ids: list[int], params: SamplingParams) -> str:
    return tokenizer.decode(
        ids,
        skip_special_tokens=params.skip_special_tokens,
        spaces_between_special_tokens=params.spaces_between_special_tokens,
    )


def decode_sequence_step(
    tokenizer, seq: Sequence, params: SamplingParams, flush: bool = False
) -> int:
    """Append the newly decodable text of ``seq`` to ``seq.output_text``.

    Args:
        tokenizer: a transformers tokenizer.
        seq: the sequence; its ``prefix_offset``/``read_offset`` are updated.
        params: skip_special_tokens / spaces_between_special_tokens.
        flush: emit everything (the sequence is finishing).
    Returns:
        The number of characters appended.
    """
    ids = seq.output_token_ids
    emitted = _decode(tokenizer, ids[seq.prefix_offset : seq.read_offset], params)
    window = _decode(tokenizer, ids[seq.prefix_offset :], params)
    if not flush and (window.endswith(_REPLACEMENT) or not window.startswith(emitted)):
        return 0
    if not window.startswith(emitted):
        # Context changed how earlier text decodes; fall back to a full decode.
        full = _decode(tokenizer, ids, params)
        added = len(full) - len(seq.output_text)
        seq.output_text = full
        seq.prefix_offset = seq.read_offset = len(ids)
        return max(added, 0)
    delta = window[len(emitted) :]
    seq.output_text += delta
    # The text up to the old read offset becomes the next window's left context.
    seq.prefix_offset = seq.read_offset
    seq.read_offset = len(ids)
    return len(delta)
