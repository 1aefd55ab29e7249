"""``vllm serve --config FILE`` (and ``vllm run-batch --config FILE``): flags from a YAML
file, as upstream vLLM reads them.

The file is a mapping of long flag names (without ``--``; dashes or underscores) to
values, for example::

    model: /models/llama-3.1-8b
    port: 8001
    max-model-len: 8192
    enable-prefix-caching: true
    allowed-origins: '["https://app.example"]'

Each entry becomes command-line text placed before the flags actually typed, so a flag
given on the command line wins over the file's. ``true`` / ``false`` set a switch either
way (``enable-prefix-caching: false`` is ``--no-enable-prefix-caching``); a list gives the
flag several values (``cuda-graph-sizes: [1, 2, 4]``); a mapping, alone or in a list, is
passed as JSON (``speculative-config: {method: ngram, ...}``, ``lora-modules: [{name: sql,
path: /adapters/sql}]``); ``model`` becomes ``--model``. A key
that is not a flag of the command (or is ``config`` itself) is an error naming it.
"""

from __future__ import annotations

import argparse
import os


def _config_path(argv: list[str]) -> tuple[str | None, list[str]]:
    """(path of ``--config``, argv without it); (None, argv) without one.

    Raises:
        ValueError: ``--config`` without a value, or given twice.
    """
    path = None
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config" or arg.startswith("--config="):
            if path is not None:
                raise ValueError("--config was given twice; pass one YAML file.")
            if arg == "--config":
                if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                    raise ValueError("--config needs a YAML file path: --config FILE.")
                path, i = argv[i + 1], i + 2
            else:
                path, i = arg.split("=", 1)[1], i + 1
            continue
        rest.append(arg)
        i += 1
    return path, rest


# The subcommands that read ``--config``.
CONFIG_COMMANDS = ("serve", "run-batch")


def _entry_args(
    key: object, value: object, path: str, actions: dict[str, argparse.Action], command: str
) -> list[str]:
    """The command-line text of one entry of the file (``actions``: the parser's actions
    by option string, to check the key and spell booleans)."""
    if not isinstance(key, str) or not key or key.startswith("-"):
        raise ValueError(
            f"{path}: keys are flag names without '--' (such as 'max-model-len'); got {key!r}."
        )
    flag = "--" + key.replace("_", "-")
    if flag == "--config":
        raise ValueError(f"{path}: a config file cannot name another one (config: {value!r}).")
    action = actions.get(flag)
    if action is None:
        raise ValueError(f"{path}: {key!r} is not a flag of vllm {command} (see --help).")
    if value is None:
        return []
    if isinstance(value, bool):
        if isinstance(action, argparse.BooleanOptionalAction):
            return [flag if value else "--no-" + flag[2:]]
        if action.nargs != 0:  # a flag that takes a value
            return [flag, str(value).lower()]
        return [flag] if value else []
    if isinstance(value, (list, tuple)):
        return [flag, *(_entry_text(v) for v in value)] if value else []
    return [flag, _entry_text(value)]


def _entry_text(value: object) -> str:
    """One value as command-line text: a mapping as JSON (the JSON-valued flags, such as
    --speculative-config, and each --lora-modules entry), anything else as ``str``."""
    if isinstance(value, dict):
        import json

        return json.dumps(value)
    return str(value)


def expand_config_file(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """``argv`` of ``vllm serve`` or ``vllm run-batch`` with ``--config FILE`` replaced by
    the file's flags, placed after the subcommand and before the typed flags (which
    therefore win).

    Args:
        argv: the arguments after the program name, e.g. ``["serve", "--config", "c.yaml"]``.
        parser: the subcommand's parser: keys are checked against its flags and booleans
            spelled as its switches expect.
    Returns:
        argv unchanged when its subcommand is not in :data:`CONFIG_COMMANDS` or it has no
        ``--config``.
    Raises:
        ValueError: the file is missing, is not YAML, is not a mapping, or has a key that is
            not a flag of the subcommand (each message names the file and the key).
    """
    if not argv or argv[0] not in CONFIG_COMMANDS:
        return argv
    command = argv[0]
    path, rest = _config_path(argv[1:])
    if path is None:
        return argv
    if not os.path.isfile(path):
        raise ValueError(f"--config {path}: no such file.")
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise ValueError(f"--config {path}: not valid YAML ({e}).") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(
            f"--config {path}: expected a mapping of flag names to values, got "
            f"{type(data).__name__}."
        )
    actions = {o: a for a in parser._actions for o in a.option_strings}
    extra: list[str] = []
    for key, value in data.items():
        extra += _entry_args(key, value, path, actions, command)
    # A typed MODEL stays first: after a list-valued flag argparse would take it as a value.
    lead = rest[:1] if rest and not rest[0].startswith("-") else []
    return [command, *lead, *extra, *rest[len(lead) :]]
