"""Reasoning parsers (``vllm serve --reasoning-parser NAME``): split a chat reply into the
model's reasoning (``message.reasoning_content`` / ``reasoning``) and its answer
(``message.content``), as upstream's parsers of the same names."""

from vllm.reasoning.parsers import (
    ReasoningParser,
    ReasoningStream,
    get_reasoning_parser,
    reasoning_parser_names,
)

__all__ = ["ReasoningParser", "ReasoningStream", "get_reasoning_parser", "reasoning_parser_names"]
