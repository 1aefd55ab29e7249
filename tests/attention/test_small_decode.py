"""FLASHINFER's small-decode path on the host side
(vllm/attention/backends/flashinfer/small_decode.py): the one-upload layout of lengths and
block tables, and the row limit, which comes from the engine config
(``--small-decode-max-rows``) through the model runner's AttentionSpec."""

import numpy as np
import pytest
import torch

from tests.worker.fakes import FakeDecodeWrapper, FakePrefillWrapper
from vllm.attention.backends.abstract import AttentionSpec, ForwardMode, StepInputs
from vllm.attention.backends.flashinfer import FlashInferBackend
from vllm.attention.backends.flashinfer.small_decode import small_decode_host


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


def _backend(max_rows: int) -> FlashInferBackend:
    spec = AttentionSpec(4, 2, 16, 16, torch.float16, torch.device("cpu"),
                         small_decode_max_rows=max_rows)  # fmt: skip
    return FlashInferBackend(spec, FakePrefillWrapper, FakeDecodeWrapper)


def test_row_limit_from_the_spec():
    """Decode steps of at most ``spec.small_decode_max_rows`` rows take the small path
    (default 1; 0 = off); prefill never does; a limit outside [0, 64] is refused."""
    spec = AttentionSpec(4, 2, 16, 16, torch.float16, torch.device("cpu"))
    assert spec.small_decode_max_rows == 1
    for limit, small_rows in ((0, []), (1, [1]), (8, [1, 2, 3, 4, 5, 6, 7, 8])):
        be = _backend(limit)
        got = [r for r in range(1, 12) if be.takes_small_path(ForwardMode.DECODE, r)]
        assert got == small_rows, (limit, got)
        assert not be.takes_small_path(ForwardMode.PREFILL, 1)
    for bad in (-1, 65):
        with pytest.raises(ValueError, match=rf"small_decode_max_rows={bad} must be in \[0, 64\]"):
            _backend(bad)


def test_row_limit_comes_from_the_engine_config(tiny_llama_dir, monkeypatch):
    """``--small-decode-max-rows`` (EngineArgs.small_decode_max_rows) reaches the backend
    through the model runner's AttentionSpec; the environment plays no part."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.worker.model_runner import ModelRunner

    monkeypatch.setenv("VLLM_SMALL_DECODE_MAX_ROWS", "0")  # not read by the engine
    for rows in (None, 0, 8):
        kw = {} if rows is None else {"small_decode_max_rows": rows}
        cfg = EngineArgs(model=tiny_llama_dir, device="cpu", **kw).create_engine_config()
        runner = ModelRunner(cfg, torch.device("cpu"))
        want = 1 if rows is None else rows
        assert runner.attn_spec.small_decode_max_rows == want
        assert FlashInferBackend(runner.attn_spec, FakePrefillWrapper,
                                 FakeDecodeWrapper).small_max_rows == want  # fmt: skip


def test_advance_grows_real_rows_only():
    """A decode-loop graph's advance: real rows one token longer, padded lanes (0) idle."""
    from types import SimpleNamespace

    from vllm.attention.backends.flashinfer.small_decode import SmallDecodeGraphBuffers

    lens = torch.tensor([0, 5, 1, 0, 130], dtype=torch.int32)
    SmallDecodeGraphBuffers.advance(SimpleNamespace(seq_lens=lens))
    assert lens.tolist() == [0, 6, 2, 0, 131] and lens.dtype == torch.int32
