"""Environment variables reach the engine through vllm/envs.py (declared name, parser,
default); tests/test_repo_rules.py checks that no other module reads os.environ."""

import pytest


def test_pp_partition_and_kv_space_come_from_envs(monkeypatch):
    from vllm.config import CacheConfig
    from vllm.distributed.utils import get_pp_partition

    monkeypatch.setenv("VLLM_PP_LAYER_PARTITION", "1,3")
    assert get_pp_partition(4, 2) == [1, 3]
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.5")
    assert CacheConfig().cpu_kvcache_space_bytes == 1 << 29
    # 0 is upstream's default value of the variable and means 4 GiB there (it was refused)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0")
    assert CacheConfig().cpu_kvcache_space_bytes == 4 << 30
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "-1")
    with pytest.raises(ValueError, match="VLLM_CPU_KVCACHE_SPACE='-1' is invalid: expected a"):
        CacheConfig()


def test_readme_lists_every_declared_variable():
    """README's environment table is exactly what ``python -m vllm.envs`` prints: one
    contiguous block, so a missing, extra or reworded row fails."""
    import pathlib

    from vllm import envs

    readme = (pathlib.Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    table = envs.describe()
    assert len([r for r in table.splitlines() if r.startswith("| `")]) == len(envs.ENV_VARS)
    assert table + "\n\n" in readme, "README's table differs from:\n" + table
