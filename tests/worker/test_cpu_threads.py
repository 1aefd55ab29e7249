"""Intra-op threads of a CPU worker: OMP_NUM_THREADS when set, else the cores per rank."""

import os

import pytest

from vllm.worker.worker import cpu_threads


def test_cores_split_over_ranks_without_omp_num_threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert [cpu_threads(w) for w in (1, 2, 3, 32)] == [16, 8, 5, 1]


@pytest.mark.parametrize(("value", "expected"), [("1", 1), ("3", 3), (" 6 ", 6), ("4,2", 4)])
def test_omp_num_threads_wins(monkeypatch, value, expected):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert cpu_threads(2) == expected


@pytest.mark.parametrize("value", ["0", "-1", "two", ",2"])
def test_bad_omp_num_threads_is_named(monkeypatch, value):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    with pytest.raises(ValueError, match="OMP_NUM_THREADS=.*positive integer"):
        cpu_threads(1)
