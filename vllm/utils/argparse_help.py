"""``--help=WHAT``: part of a command's help, as upstream vLLM's ``vllm serve --help=...``.

``WHAT`` is one of:

- ``listgroup``: the argument groups' titles and descriptions;
- ``all``: the whole help (the same as ``--help``); ``page``: the whole help through a pager
  (``$PAGER`` or ``less`` on a terminal, plain output otherwise);
- a group: its title (``cache options``), the title's first words (``cache``) or upstream's
  config class name (``CacheConfig``; ``Frontend`` is the server group), any case;
- a flag or a keyword: every flag whose name contains it (``max-num-seqs``, ``max``;
  underscores read as dashes).

Anything else is a usage error naming the word and ``--help=listgroup``.
"""

from __future__ import annotations

import argparse
import pydoc

# Upstream's group titles for the groups whose own names differ.
_UPSTREAM_GROUP_NAMES = {"frontend": "server", "loraconfig": "lora"}


def help_request(args: list[str]) -> str | None:
    """The ``WHAT`` of the first ``--help=WHAT`` in ``args`` (before a bare ``--``), or None."""
    for arg in args:
        if arg == "--":
            return None
        if arg.startswith("--help="):
            return arg.split("=", 1)[1]
    return None


def _group_key(name: str) -> str:
    """``name`` lowercased without spaces, dashes, underscores, ``options`` or ``config``."""
    key = name.lower().replace(" ", "").replace("-", "").replace("_", "")
    for suffix in ("options", "config"):
        key = key.removesuffix(suffix)
    return key


def filtered_help(parser: argparse.ArgumentParser, what: str) -> str:
    """The help text ``--help=WHAT`` shows (see the module docstring).

    Raises:
        ValueError: ``what`` names no group and is part of no flag's name.
    """
    if what in ("all", "page"):
        return parser.format_help()
    groups = [g for g in parser._action_groups if g._group_actions]
    if what == "listgroup":
        lines = ["Argument groups (show one with --help=GROUP):"]
        for g in groups:
            lines.append(f"  {g.title}" + (f": {g.description}" if g.description else ""))
        return "\n".join(lines) + "\n"
    key = _group_key(what)
    key = _UPSTREAM_GROUP_NAMES.get(key + "config", _UPSTREAM_GROUP_NAMES.get(key, key))
    for g in groups:
        if key and _group_key(g.title or "") == key:
            formatter = parser._get_formatter()
            formatter.start_section(g.title)
            formatter.add_text(g.description)
            formatter.add_arguments(g._group_actions)
            formatter.end_section()
            return formatter.format_help()
    word = what.lower().replace("_", "-").lstrip("-")
    matched = [
        a for a in parser._actions if word and any(word in opt.lower() for opt in a.option_strings)
    ]
    if not matched:
        raise ValueError(
            f"--help={what} matches no argument group or flag; --help=listgroup lists the groups"
        )
    formatter = parser._get_formatter()
    formatter.start_section(f"flags matching {what!r}")
    formatter.add_arguments(matched)
    formatter.end_section()
    return formatter.format_help()


def show_filtered_help(parser: argparse.ArgumentParser, what: str) -> None:
    """Print ``filtered_help(parser, what)`` (through a pager for ``page``) and exit with
    status 0; a word that matches nothing is the parser's usage error (status 2)."""
    try:
        text = filtered_help(parser, what)
    except ValueError as e:
        parser.error(str(e))
    if what == "page":
        pydoc.pager(text)
    else:
        print(text, end="")
    parser.exit(0)
