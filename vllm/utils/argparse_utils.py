"""``FlexibleArgumentParser``: the argparse parser every command line of vLLM is built on
(upstream's name and import paths: ``vllm.utils`` and ``vllm.utils.argparse_utils``).

Two differences from ``argparse.ArgumentParser``, both as upstream has them:

- no abbreviations (``allow_abbrev=False``): ``--max-model 99`` is an error, never a
  silent ``--max-model-len 99``, and ``--model`` never lands in
  ``--model-loader-extra-config``;
- a long flag may be spelled with underscores: ``--max_model_len 99`` and
  ``--max_model_len=99`` are ``--max-model-len 99`` (only the name before ``=`` changes;
  nothing after a bare ``--`` is touched).

Subparsers made with ``add_subparsers().add_parser`` are of the same class, so they
inherit both.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def dashed_flags(args: Sequence[str]) -> list[str]:
    """``args`` with each long flag's name spelled with dashes (``--foo_bar=x`` ->
    ``--foo-bar=x``); values, short flags and everything after ``--`` unchanged."""
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--":
            return out + list(args[i:])
        if arg.startswith("--") and len(arg) > 2:
            name, sep, value = arg.partition("=")
            arg = "--" + name[2:].replace("_", "-") + sep + value
        out.append(arg)
    return out


class FlexibleArgumentParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` without abbreviations that reads ``--foo_bar`` as
    ``--foo-bar`` (see the module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else args
        return super().parse_known_args(dashed_flags(args), namespace)
