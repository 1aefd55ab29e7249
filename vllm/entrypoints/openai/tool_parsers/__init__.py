"""Tool-call parsers for tool_choice "auto", chosen by name (``--tool-call-parser``); more
come from a ``--tool-parser-plugin`` file (plugin.py)."""

from vllm.entrypoints.openai.tool_parsers import (  # noqa: F401  (register)
    deepseek,
    glm45,
    hermes,
    llama3_json,
    mistral,
    pythonic,
)
from vllm.entrypoints.openai.tool_parsers.abstract import (
    ExtractedToolCalls,
    ToolParser,
    get_tool_parser,
    register_tool_parser,
    tool_parser_names,
)
from vllm.entrypoints.openai.tool_parsers.plugin import load_tool_parser_plugin

__all__ = [
    "ExtractedToolCalls",
    "ToolParser",
    "get_tool_parser",
    "load_tool_parser_plugin",
    "register_tool_parser",
    "tool_parser_names",
]
