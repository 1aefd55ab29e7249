"""The text of one token in a logprobs entry (``Logprob.decoded_token``, the OpenAI
server's ``tokens`` / ``top_logprobs`` keys): the token decoded on its own, as upstream
vLLM shows it, not a slice of the sequence's text (which the detokenizer makes)."""

from __future__ import annotations

from vllm.sequence import PositionLogprobs

# The word-start marker of SentencePiece vocabularies ("▁world"): their decoders turn it
# into a space, and a Llama 2 / Mistral style decoder drops the space a decode starts with.
_WORD_START = "\u2581"


def token_text(tokenizer, token_id: int) -> str:
    """The text a logprobs entry shows for ``token_id``: ``tokenizer.decode([token_id])``
    (special tokens included), with the leading spaces restored that a SentencePiece
    decode strips from a word-initial piece ("▁world" -> " world", as upstream vLLM shows
    it), so that "▁world" and "world" stay two entries of a completion's ``top_logprobs``.
    A piece of a multi-byte character decodes to U+FFFD, as in upstream vLLM."""
    text = tokenizer.decode([token_id])
    piece = tokenizer.convert_ids_to_tokens(token_id)
    if isinstance(piece, str) and piece.startswith(_WORD_START):
        spaces = len(piece) - len(piece.lstrip(_WORD_START))
        kept = len(text) - len(text.lstrip(" "))
        if kept < spaces:
            text = " " * (spaces - kept) + text
    return text


def fill_decoded_tokens(tokenizer, positions: list[PositionLogprobs | None] | None) -> None:
    """Set ``decoded_token`` of every Logprob in ``positions`` that has none: the token's
    own text (:func:`token_text`, the text the OpenAI server shows for a logprobs entry).
    No-op without a tokenizer or positions."""
    if tokenizer is None or not positions:
        return
    for pos in positions:
        if not pos:
            continue
        for tid, lp in pos.items():
            if lp.decoded_token is None:
                lp.decoded_token = token_text(tokenizer, tid)
