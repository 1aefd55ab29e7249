"""Test-only settings live on the test side: no fault-injection hook in the engine and no
user-facing virtual-engine override flag; tests build such engines with
tests/utils.py's virtual_engines_override."""

import argparse
import pathlib

import pytest

import vllm
from tests.utils import virtual_engines_override
from vllm.engine.arg_utils import EngineArgs


def test_no_fault_hook_in_engine_code():
    for path in pathlib.Path(vllm.__file__).parent.rglob("*.py"):
        assert "VLLM_TEST_FAULT_PROMPT" not in path.read_text(), path


def test_no_virtual_engine_override_flag():
    assert "num_virtual_engines_override" not in EngineArgs.__dataclass_fields__
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    with pytest.raises(SystemExit):
        parser.parse_args(["--num-virtual-engines-override", "2"])


def test_virtual_engines_override_helper(tiny_llama_dir):
    args = EngineArgs(model=tiny_llama_dir, device="cpu")
    assert args.create_engine_config().num_virtual_engines == 1
    with virtual_engines_override(2):
        config = args.create_engine_config()
    assert config.num_virtual_engines == 2
    assert config.parallel_config.pipeline_parallel_size == 1
    assert args.create_engine_config().num_virtual_engines == 1  # restored on exit
