"""N-gram prompt lookup (upstream's "[ngram]" proposer; Saxena 2023, "Prompt Lookup
Decoding"): find the most recent earlier occurrence of the sequence's last n tokens, trying
n from ``ngram_prompt_lookup_max`` down to ``ngram_prompt_lookup_min``, and propose the tokens
that followed it. Stateless: nothing to drop when a request ends."""

from __future__ import annotations


def proposal_len(seq_len: int, k: int, max_model_len: int, draft_limit: int) -> int:
    """How many tokens a sequence of ``seq_len`` tokens may propose this step (0..k).

    A step with L proposals emits up to L + 1 tokens and writes the target's KV at
    positions seq_len - 1 .. seq_len - 1 + L, so L <= max_model_len - seq_len - 1 keeps the
    sequence within max_model_len; the draft writes up to position seq_len + L - 2 and
    L <= draft_limit - seq_len - 1 keeps it below the draft's limit too. 0 means the sequence
    decodes normally.
    """
    return max(0, min(k, max_model_len - seq_len - 1, draft_limit - seq_len - 1))


def ngram_lookup(tokens: list[int], max_n: int, min_n: int, num: int) -> list[int]:
    """Up to ``num`` tokens following the latest earlier match of the longest suffix n-gram.

    The n-gram of length n ending at an earlier position e (e < len - 1) matches when
    ``tokens[e - n + 1 : e + 1] == tokens[-n:]``; the longest n in [min_n, max_n] with any
    match wins, then the latest e, and the result is ``tokens[e + 1 : e + 1 + num]``. Only
    positions holding the last token can match: they are found by ``list.index`` on the
    reversed list (C speed), each extended backwards at most ``max_n`` tokens, and the scan
    stops at the first (latest) full-length match. Cost: O(len) for the reversed copy plus
    O(max_n) per occurrence of the last token, instead of O(len x max_n) slice compares.

    Args:
        tokens: the sequence's ids (prompt + output).
        max_n, min_n: n-gram lengths tried, longest first (min_n >= 1).
        num: most tokens to return.
    Returns:
        the proposed ids (empty when no suffix n-gram recurs or num == 0).
    """
    size = len(tokens)
    top = min(max_n, size - 1)
    if num <= 0 or top < min_n:
        return []
    rev = tokens[::-1]  # rev[s] = tokens[size - 1 - s]; the suffix is rev[:n]
    last = rev[0]
    best_len, best_s = 0, 0
    s = 0
    while best_len < top:
        try:
            s = rev.index(last, s + 1)  # next earlier occurrence, ending at size - 1 - s
        except ValueError:
            break
        length = 1
        cap = min(top, size - s)  # the n-gram must start at or after position 0
        while length < cap and rev[s + length] == rev[length]:
            length += 1
        if length > best_len:  # strictly longer: an equal length found later is older
            best_len, best_s = length, s
    if best_len < min_n:
        return []
    end = size - 1 - best_s
    return tokens[end + 1 : end + 1 + num]


class NGramProposer:
    """Proposes by prompt lookup; see :func:`ngram_lookup`."""

    def __init__(self, max_n: int, min_n: int):
        self.max_n = max_n
        self.min_n = min_n

    def propose(self, token_lists: list[list[int]], caps: list[int]) -> list[list[int]]:
        """One proposal list per sequence, each at most ``caps[i]`` long."""
        return [ngram_lookup(t, self.max_n, self.min_n, c) for t, c in zip(token_lists, caps)]

    def free(self, seq_ids: list[int]) -> None:
        """No per-sequence state."""

    def num_tracked(self) -> int:
        return 0
