"""``bad_words``: words a request never generates (upstream vLLM's SamplingParams field).

Each word becomes one or two token sequences (:func:`bad_words_token_ids`): the word
tokenized without special tokens, and tokenized after a leading space (how it appears in
the middle of text) when that gives a different first token and the same number of tokens.
At every step a sequence's last token is banned (logit -inf) when the tokens generated just
before match the sequence's other tokens (:func:`banned_tokens`); the last token of a
one-token sequence is therefore always banned. Only generated tokens are matched, not the
prompt: a word may still be completed across the prompt's end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def bad_words_token_ids(
    words: Sequence[str], encode: Callable[[str], list[int]]
) -> list[list[int]]:
    """The token sequences that ``words`` ban; ``encode`` tokenizes text without special
    tokens. A word that tokenizes to nothing bans nothing."""
    out: list[list[int]] = []
    for word in words:
        bare = encode(word.lstrip())
        if bare:
            out.append(bare)
        spaced = encode(" " + word.lstrip())
        if spaced and (not bare or (spaced[0] != bare[0] and len(spaced) == len(bare))):
            out.append(spaced)
    return out


def banned_tokens(sequences: Sequence[Sequence[int]], generated: Sequence[int]) -> list[int]:
    """The tokens banned at the next step after ``generated``: the last token of every
    sequence whose other tokens are the last tokens of ``generated``."""
    banned = []
    for seq in sequences:
        prefix = len(seq) - 1
        if prefix == 0 or (
            len(generated) >= prefix
            and tuple(generated[len(generated) - prefix :]) == tuple(seq[:-1])
        ):
            banned.append(seq[-1])
    return banned
