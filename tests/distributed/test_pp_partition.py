"""Pipeline-parallel layer partition: contiguous stages, first (L % P) stages one larger."""

import pytest

from vllm.distributed.utils import PP_PARTITION_ENV, get_pp_indices, get_pp_partition


@pytest.fixture(autouse=True)
def _no_env_override(monkeypatch):
    monkeypatch.delenv(PP_PARTITION_ENV, raising=False)


@pytest.mark.parametrize(
    "num_layers, pp_size, sizes",
    [
        (61, 8, [8, 8, 8, 8, 8, 7, 7, 7]),
        (10, 3, [4, 3, 3]),
        (30, 4, [8, 8, 7, 7]),
        (32, 4, [8, 8, 8, 8]),
        (3, 3, [1, 1, 1]),
        (5, 1, [5]),
    ],
)
def test_partition_sizes_and_indices(num_layers, pp_size, sizes):
    assert get_pp_partition(num_layers, pp_size) == sizes
    indices = [get_pp_indices(num_layers, rank, pp_size) for rank in range(pp_size)]
    assert [end - start for start, end in indices] == sizes
    assert indices[0][0] == 0 and indices[-1][1] == num_layers
    assert all(indices[i][1] == indices[i + 1][0] for i in range(pp_size - 1))


def test_fewer_layers_than_stages_is_an_error():
    with pytest.raises(ValueError, match="2 layers over 3 pipeline stages"):
        get_pp_indices(2, 0, 3)


def test_rank_out_of_range():
    with pytest.raises(ValueError, match="pp_rank=2 out of range for pp_size=2"):
        get_pp_indices(4, 2, 2)


def test_env_override(monkeypatch):
    monkeypatch.setenv(PP_PARTITION_ENV, "2,5,3")
    assert get_pp_partition(10, 3) == [2, 5, 3]
    assert [get_pp_indices(10, r, 3) for r in range(3)] == [(0, 2), (2, 7), (7, 10)]


@pytest.mark.parametrize("value", ["4,3,4", "5,5", "4,3,2,1", "10,0,0", "a,b,c"])
def test_bad_env_override(monkeypatch, value):
    monkeypatch.setenv(PP_PARTITION_ENV, value)
    with pytest.raises(ValueError, match=PP_PARTITION_ENV) as info:
        get_pp_partition(10, 3)
    if value != "a,b,c":
        assert "num_layers=10" in str(info.value) and "pp_size=3" in str(info.value)


def test_bad_env_override_is_refused_before_any_worker_starts(monkeypatch, tiny_llama_dir):
    """The engine config checks the override against the model's layers, so `vllm serve`
    prints one error line instead of failing in every worker."""
    from vllm import EngineArgs

    monkeypatch.setenv(PP_PARTITION_ENV, "10,10")
    args = EngineArgs(model=tiny_llama_dir, device="cpu", pipeline_parallel_size=2)
    with pytest.raises(ValueError, match=r"VLLM_PP_LAYER_PARTITION='10,10' gives 2 stages"):
        args.create_engine_config()
    monkeypatch.setenv(PP_PARTITION_ENV, "1,2")
    assert args.create_engine_config().parallel_config.pipeline_parallel_size == 2
