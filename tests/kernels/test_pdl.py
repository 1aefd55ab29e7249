"""The PDL rule the decode-path kernels launch by (vllm/kernels/pdl.py): on for CUDA tensors
on Hopper or later only, off with VLLM_TRITON_PDL=0."""

import importlib.util

import pytest
import torch


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
def test_pdl_only_on_cuda(monkeypatch):
    from vllm.kernels.pdl import launch_options, pdl_enabled

    x = torch.zeros(2)
    assert not pdl_enabled(x) and launch_options(pdl_enabled(x)) == {}
    assert launch_options(True) == {"launch_pdl": True}
    monkeypatch.setenv("VLLM_TRITON_PDL", "0")
    assert not pdl_enabled(x)
