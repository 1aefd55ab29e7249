"""``FlexibleArgumentParser``: the argparse parser every command line of vLLM is built on
(upstream's name and import paths: ``vllm.utils`` and ``vllm.utils.argparse_utils``).

Five differences from ``argparse.ArgumentParser``, the first two as upstream has them:

- no abbreviations (``allow_abbrev=False``): ``--max-model 99`` is an error, never a
  silent ``--max-model-len 99``, and ``--model`` never lands in
  ``--model-loader-extra-config``;
- a long flag may be spelled with underscores: ``--max_model_len 99`` and
  ``--max_model_len=99`` are ``--max-model-len 99`` (only the name before ``=`` changes;
  nothing after a bare ``--`` is touched);
- a switch with a ``--no-`` form (``argparse.BooleanOptionalAction``) also takes an
  explicit value, upstream V0's spelling of such switches: ``--enable-chunked-prefill
  false`` and ``--enable-chunked-prefill=false`` are ``--no-enable-chunked-prefill`` (a
  word after the switch that is no boolean, such as a positional MODEL, stays a
  positional);
- a usage error is one line on stderr, ``error: MESSAGE (see `PROG --help`)``, and exit
  status 2, instead of the whole usage first (the CLI's, the benchmarks' and the
  examples' errors read alike);
- ``--help`` states every flag's default (:class:`HelpFormatter`, unless a parser names
  another ``formatter_class``), and ``--help=WHAT`` shows part of it, as upstream
  (``listgroup``, a group, a flag or a keyword: :mod:`vllm.utils.argparse_help`).

Subparsers made with ``add_subparsers().add_parser`` are of the same class, so they
inherit all five.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from vllm import envs
from vllm.utils.argparse_help import help_request, show_filtered_help


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


def _switch_value(word: str) -> bool | None:
    """A switch's explicit value in :func:`vllm.envs.parse_flag`'s spellings (true / false,
    1 / 0, yes / no, on / off, any case), or None for any other word."""
    try:
        return envs.parse_flag(word)
    except ValueError:
        return None


def explicit_switch_values(parser: argparse.ArgumentParser, args: list[str]) -> list[str]:
    """``args`` with each ``--switch VALUE`` and ``--switch=VALUE`` of a switch that has a
    ``--no-`` form written as ``--switch`` or ``--no-switch`` (VALUE: true / false, 1 / 0,
    yes / no, on / off, any case). A following word that is no such value is left alone
    (it is the next argument); a ``--switch=VALUE`` with another VALUE is a usage error.
    Flags after a bare ``--`` are not touched."""
    switches = {  # each spelling of a switch -> its --no- form (a short -ep too)
        s: next(o for o in action.option_strings if o.startswith("--no-"))
        for action in parser._actions
        if isinstance(action, argparse.BooleanOptionalAction)
        for s in action.option_strings
        if not s.startswith("--no-")
    }
    if not switches:
        return args
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return out + args[i:]
        name, sep, value = arg.partition("=")
        if name in switches:
            on = True
            if sep:
                on = _switch_value(value)
                if on is None:
                    parser.error(f"argument {name}: expected true or false, got {value!r}")
            elif i + 1 < len(args) and (following := _switch_value(args[i + 1])) is not None:
                on = following
                i += 1
            arg = name if on else switches[name]
        out.append(arg)
        i += 1
    return out


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Appends ``(default: X)`` to every flag whose help does not already state its
    default (``off`` for a switch); descriptions keep their line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is argparse.SUPPRESS or not action.option_strings:
            return text
        if "(default" in text.lower():  # the help states its default itself
            return text
        default = action.default
        if isinstance(action, (argparse._StoreTrueAction, argparse.BooleanOptionalAction)):
            shown = "on" if default else "off"
        elif isinstance(default, (list, tuple)):
            shown = " ".join(str(d) for d in default)
        else:
            shown = str(default)
        return f"{text} (default: {shown})"


class FlexibleArgumentParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` without abbreviations that reads ``--foo_bar`` as
    ``--foo-bar`` and shows defaults in ``--help`` (see the module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        """Print ``message`` as one ``error:`` line naming ``--help``, exit with status 2."""
        sys.stderr.write(f"error: {message} (see `{self.help_prog()} --help`)\n")
        sys.exit(2)

    def help_prog(self) -> str:
        """The command whose ``--help`` an error line points to (``prog``)."""
        return self.prog

    def _delegates(self) -> bool:
        """Whether the arguments after a positional go to another parser (subcommands, or
        ``vllm bench``'s flags for a script): that parser answers ``--help=WHAT``."""
        return self._subparsers is not None or any(
            a.nargs == argparse.REMAINDER for a in self._actions
        )

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        what = help_request(args)
        if what is not None and not self._delegates():
            show_filtered_help(self, what)
        args = explicit_switch_values(self, dashed_flags(args))
        return super().parse_known_args(args, namespace)
