"""Intra-op threads of a CPU worker: OMP_NUM_THREADS where the engine starts, else the
worker host's cores per rank."""

import os

import pytest

from vllm.engine.arg_utils import EngineArgs
from vllm.worker.worker import cpu_threads


def _parallel(tiny_llama_dir, **kw):
    args = EngineArgs(model=tiny_llama_dir, device="cpu", **kw)
    return args.create_engine_config().parallel_config


def test_cores_split_over_ranks_by_default(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert [cpu_threads(w) for w in (1, 2, 3, 32)] == [16, 8, 5, 1]
    assert cpu_threads(2, 3) == 3


@pytest.mark.parametrize(
    ("value", "expected"), [(None, None), ("", None), ("1", 1), (" 6 ", 6), ("+3", 3), ("4,2", 4)]
)
def test_omp_num_threads_read_into_the_config(tiny_llama_dir, monkeypatch, value, expected):
    """Read once where the engine starts (a Ray actor's own OMP_NUM_THREADS, its CPU
    reservation, does not reach the worker's thread count)."""
    if value is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", value)
    parallel = _parallel(tiny_llama_dir, pipeline_parallel_size=2)
    assert parallel.cpu_threads == expected
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what Ray sets in an actor
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert cpu_threads(parallel.world_size, parallel.cpu_threads) == (expected or 8)


@pytest.mark.parametrize("value", ["0", "-1", "two", ",2"])
def test_bad_omp_num_threads_is_named(tiny_llama_dir, monkeypatch, value):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    with pytest.raises(ValueError, match=r"OMP_NUM_THREADS=.* positive integer"):
        _parallel(tiny_llama_dir)
