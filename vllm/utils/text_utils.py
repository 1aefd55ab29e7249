"""Text helpers of the serving layer's streaming parsers (tool calls, reasoning)."""

from __future__ import annotations


def partial_marker_len(text: str, marker: str) -> int:
    """Length of the longest proper prefix of ``marker`` that ``text`` ends with (0: none):
    the tail a streaming parser holds back because the next piece may complete the marker
    (``"Hi <tool"`` ends with 5 characters of ``"<tool_call>"``)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0
