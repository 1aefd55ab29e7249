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

    Args:
        tokens: the sequence's ids (prompt + output).
        max_n, min_n: n-gram lengths tried, longest first.
        num: most tokens to return.
    Returns:
        the proposed ids (empty when no suffix n-gram recurs or num == 0).
    """
    if num <= 0:
        return []
    size = len(tokens)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = tokens[size - n :]
        # latest start i < size - n with tokens[i:i+n] == suffix
        for i in range(size - n - 1, -1, -1):
            if tokens[i : i + n] == suffix:
                return tokens[i + n : i + n + num]
    return []


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
