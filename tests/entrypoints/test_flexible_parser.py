"""FlexibleArgumentParser and EngineArgs.add_cli_args as upstream's scripts use them:
underscore spellings, no abbreviations, ``--model`` added when the parser has none, and
upstream V0's valued switches (``--enable-chunked-prefill false``)."""

from __future__ import annotations

import pytest

from vllm.engine.arg_utils import EngineArgs
from vllm.entrypoints import cli
from vllm.utils import FlexibleArgumentParser
from vllm.utils.argparse_utils import FlexibleArgumentParser as FromSubmodule


def _engine_parser() -> FlexibleArgumentParser:
    return EngineArgs.add_cli_args(FlexibleArgumentParser())


def test_both_import_paths_name_one_class():
    assert FlexibleArgumentParser is FromSubmodule


@pytest.mark.parametrize(
    "argv",
    [
        ["--max_model_len", "99", "--enable_prefix_caching"],
        ["--max_model_len=99", "--enable_prefix_caching"],
        ["--max-model-len=99", "--enable-prefix-caching"],
    ],
)
def test_underscore_spellings(argv):
    args = _engine_parser().parse_args(argv)
    assert args.max_model_len == 99 and args.enable_prefix_caching is True


def test_only_the_flag_name_is_respelled():
    p = FlexibleArgumentParser()
    p.add_argument("--chat-template")
    p.add_argument("rest", nargs="*")
    args = p.parse_args(["--chat_template=a_b", "--", "--x_y"])
    assert args.chat_template == "a_b" and args.rest == ["--x_y"]


@pytest.mark.parametrize("argv", [["--max-model", "99"], ["--model-loader", "{}"]])
def test_no_abbreviations(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        _engine_parser().parse_args(argv)
    assert exc.value.code == 2
    assert f"unrecognized arguments: {' '.join(argv)}" in capsys.readouterr().err


def test_serve_refuses_abbreviations(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.make_parser().parse_args(["serve", "m", "--max-model", "99"])
    assert exc.value.code == 2
    assert "error: unrecognized arguments: --max-model 99" in capsys.readouterr().err


def test_serve_reads_underscores_and_keeps_its_positional_model():
    args = cli.make_parser().parse_args(["serve", "/m", "--max_model_len=64", "--port", "1"])
    assert (args.model, args.model_flag, args.max_model_len) == ("/m", None, 64)
    args = cli.make_parser().parse_args(["serve", "--model", "/m"])
    assert (args.model, args.model_flag) == (None, "/m")


def test_add_cli_args_adds_model_and_returns_the_parser(tiny_llama_dir):
    """Upstream's example pattern end to end: before --model existed here, argparse's
    prefix matching stored ``--model X`` in --model-loader-extra-config and
    from_cli_args failed with "model must be given"."""
    parser = FlexibleArgumentParser(description="example")
    parser = EngineArgs.add_cli_args(parser)
    args = parser.parse_args(["--model", tiny_llama_dir, "--max-model-len", "64"])
    engine_args = EngineArgs.from_cli_args(args)
    assert engine_args.model == tiny_llama_dir and engine_args.max_model_len == 64
    assert engine_args.model_loader_extra_config is None


def test_add_cli_args_keeps_a_model_the_caller_declared():
    p = FlexibleArgumentParser()
    p.add_argument("--model", default="/default")
    EngineArgs.add_cli_args(p)
    assert p.parse_args([]).model == "/default"
    assert sum(a.dest == "model" for a in p._actions) == 1


@pytest.mark.parametrize("command", [[], ["serve", "m"], ["run-batch", "-i", "a", "-o", "b"]])
def test_upstream_short_flags(command):
    """``-tp``, ``-pp``, ``-q`` and ``-O`` (``-O3`` too) are upstream's short spellings of
    --tensor-parallel-size, --pipeline-parallel-size, --quantization and
    --compilation-config. Guards: ``vllm serve M -tp 2`` was "unrecognized arguments"."""
    parser = cli.make_parser() if command else _engine_parser()
    args = parser.parse_args([*command, "-tp", "2", "-pp=3", "-q", "gguf", "-O3"])
    assert args.tensor_parallel_size == 2 and args.pipeline_parallel_size == 3
    assert args.quantization == "gguf" and args.compilation_config == "3"
    assert EngineArgs.from_cli_args(args).tensor_parallel_size == 2


def test_a_short_flag_the_caller_declared_stays_its_own():
    p = FlexibleArgumentParser()
    p.add_argument("-q", "--quick", default=None)
    args = EngineArgs.add_cli_args(p).parse_args(["-q", "hi", "--quantization", "gguf"])
    assert args.quick == "hi" and args.quantization == "gguf"


@pytest.mark.parametrize(
    "spelled, value",
    [
        ([], False),
        (["--enable-chunked-prefill"], True),
        (["--enable-chunked-prefill", "False"], False),
        (["--enable-chunked-prefill", "true"], True),
        (["--enable-chunked-prefill=false"], False),
        (["--enable_chunked_prefill=1"], True),
        (["--no-enable-chunked-prefill"], False),
    ],
)
def test_switches_take_upstream_v0_values(spelled, value):
    """A switch with a --no- form also takes an explicit value, as upstream V0 spelled
    ``--enable-chunked-prefill [ENABLE_CHUNKED_PREFILL]``; a word after it that is no
    boolean stays the positional MODEL.

    Guards: ``vllm serve MODEL --enable-chunked-prefill False`` (upstream V0's way of
    turning it off) was a start-up error, "unrecognized arguments: False"."""
    for argv in (["serve", "/m", *spelled], ["serve", *spelled, "/m"]):
        args = cli.make_parser().parse_args(argv)
        assert args.model == "/m" and args.enable_chunked_prefill is value, argv
    args = _engine_parser().parse_args(["--enable-prefix-caching", "off", "--model", "m"])
    assert args.enable_prefix_caching is False and args.model == "m"


def test_a_switch_value_that_is_no_boolean_is_an_error(capsys):
    with pytest.raises(SystemExit) as info:
        cli.make_parser().parse_args(["serve", "/m", "--enable-chunked-prefill=maybe"])
    assert info.value.code == 2
    assert (
        "--enable-chunked-prefill: expected true or false, got 'maybe'" in capsys.readouterr().err
    )
