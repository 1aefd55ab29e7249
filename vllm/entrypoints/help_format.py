"""The help formatter of the ``vllm`` command line, shared by ``vllm serve`` and
``python -m vllm.entrypoints.openai.api_server`` (a module of its own, so that neither
entry point imports the other)."""

from __future__ import annotations

import argparse


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Appends ``(default: X)`` to every flag whose help does not already state its
    default (``off`` for a switch)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is argparse.SUPPRESS or not action.option_strings:
            return text
        if "default" in text.lower():
            return text
        default = action.default
        if isinstance(action, argparse._StoreTrueAction):
            shown = "on" if default else "off"
        elif isinstance(default, (list, tuple)):
            shown = " ".join(str(d) for d in default)
        else:
            shown = str(default)
        return f"{text} (default: {shown})"
