"""FLASHINFER's small-decode path on the host side (vllm/attention/backends/small_decode.py):
the one-upload layout of lengths and block tables, the row limit switch, and the PDL rule
its kernel launches by (vllm/model_executor/layers/triton_pdl.py)."""

import importlib.util

import numpy as np
import pytest
import torch

from vllm.attention.backends.abstract import ForwardMode, StepInputs
from vllm.attention.backends.small_decode import small_decode_host, small_decode_max_rows


def _step(lens, tables):
    return StepInputs(ForwardMode.DECODE, lens, [1] * len(lens), tables, [0] * len(lens), 2)


def test_host_layout_pads_with_the_scratch_block():
    step = _step([5, 40, 0], [[7], [3, 9, 4], []])  # a padded lane last
    buf = small_decode_host(step, fill=99)
    assert buf.dtype == np.int32
    assert buf[:3].tolist() == [5, 40, 0]
    assert buf[3:].reshape(3, 3).tolist() == [[7, 99, 99], [3, 9, 4], [99, 99, 99]]
    # a graph's fixed width: wider pads, narrower clips each row's table
    assert small_decode_host(step, 99, width=4)[3:].reshape(3, 4)[1].tolist() == [3, 9, 4, 99]
    assert small_decode_host(step, 99, width=2)[3:].reshape(3, 2).tolist() == [
        [7, 99], [3, 9], [99, 99],
    ]  # fmt: skip


def test_row_limit_switch(monkeypatch):
    monkeypatch.delenv("VLLM_SMALL_DECODE_MAX_ROWS", raising=False)
    assert small_decode_max_rows() == 1  # one row by default (see the module docstring)
    monkeypatch.setenv("VLLM_SMALL_DECODE_MAX_ROWS", "0")
    assert small_decode_max_rows() == 0
    monkeypatch.setenv("VLLM_SMALL_DECODE_MAX_ROWS", "8")
    assert small_decode_max_rows() == 8
    for bad in ("-1", "65", "eight"):
        monkeypatch.setenv("VLLM_SMALL_DECODE_MAX_ROWS", bad)
        with pytest.raises(ValueError, match=f"VLLM_SMALL_DECODE_MAX_ROWS='{bad}'"):
            small_decode_max_rows()


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
def test_pdl_only_on_cuda(monkeypatch):
    from vllm.model_executor.layers.triton_pdl import launch_options, pdl_enabled

    x = torch.zeros(2)
    assert not pdl_enabled(x) and launch_options(pdl_enabled(x)) == {}
    assert launch_options(True) == {"launch_pdl": True}
    monkeypatch.setenv("VLLM_TRITON_PDL", "0")
    assert not pdl_enabled(x)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
def test_pdl_trigger_setting(monkeypatch):
    """VLLM_PDL_TRIGGER: "late" by default, "early" on request, anything else refused."""
    from vllm.model_executor.layers import triton_pdl

    monkeypatch.delenv("VLLM_PDL_TRIGGER", raising=False)
    assert triton_pdl.pdl_trigger() == "late"
    assert not triton_pdl.TRIGGER_EARLY.value  # this process imported it with the default
    monkeypatch.setenv("VLLM_PDL_TRIGGER", "early")
    assert triton_pdl.pdl_trigger() == "early"
    monkeypatch.setenv("VLLM_PDL_TRIGGER", "sooner")
    with pytest.raises(ValueError, match="VLLM_PDL_TRIGGER='sooner' must be 'late' or 'early'"):
        triton_pdl.pdl_trigger()


def test_advance_grows_real_rows_only():
    """A decode-loop graph's advance: real rows one token longer, padded lanes (0) idle."""
    from types import SimpleNamespace

    from vllm.attention.backends.small_decode import SmallDecodeGraphBuffers

    lens = torch.tensor([0, 5, 1, 0, 130], dtype=torch.int32)
    SmallDecodeGraphBuffers.advance(SimpleNamespace(seq_lens=lens))
    assert lens.tolist() == [0, 6, 2, 0, 131] and lens.dtype == torch.int32
