"""``--tool-parser-plugin PATH``: a Python file, imported at start-up, that registers more
tool-call parsers, as upstream's flag. For example::

    from vllm.entrypoints.openai.tool_parsers import ToolParser, register_tool_parser

    @register_tool_parser("my_format")
    class MyParser(ToolParser):
        def extract(self, text): ...
        def content_prefix(self, text): ...

then ``vllm serve MODEL --tool-parser-plugin my_parser.py --enable-auto-tool-choice
--tool-call-parser my_format``. A parser that needs the request's tools (their parameter
schemas, say) also overrides ``extract_for(self, text, tools)``, which the server calls
and which by default returns ``extract(text)``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys


def load_tool_parser_plugin(path: str) -> None:
    """Import the file at ``path`` as a module of its own (``vllm_tool_parser_plugin_`` and
    the file's stem), so the parsers it registers can be named by ``--tool-call-parser``.

    Raises:
        ValueError: naming ``path``: it is not a file, not a Python source, or importing
            it raised (the error's type and message follow; for an import of a ``vllm``
            name this package lacks, such as upstream's ToolParserManager, also the
            interface a plugin needs here).
    """
    if not os.path.isfile(path):
        raise ValueError(f"--tool-parser-plugin {path!r} is not a file.")
    stem = os.path.splitext(os.path.basename(path))[0]
    name = "vllm_tool_parser_plugin_" + re.sub(r"\W", "_", stem)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"--tool-parser-plugin {path!r} is not a Python source file (*.py).")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise ValueError(
            f"--tool-parser-plugin {path!r} failed to import: {type(e).__name__}: {e}"
            + (UPSTREAM_API_HINT if _imports_missing_vllm_name(e) else "")
        ) from e


# Added to the error of a plugin that imports what this package does not have (upstream's
# ToolParserManager, its module paths): the interface a plugin file needs here.
UPSTREAM_API_HINT = (
    " (upstream's ToolParserManager plugins do not load here: subclass ToolParser from "
    "vllm.entrypoints.openai.tool_parsers, implement extract(text) and "
    "content_prefix(text), and register it with @register_tool_parser(NAME))"
)


def _imports_missing_vllm_name(e: Exception) -> bool:
    """Whether ``e`` is an ImportError for a module or name of ``vllm``."""
    return isinstance(e, ImportError) and (e.name or "").split(".")[0] == "vllm"
