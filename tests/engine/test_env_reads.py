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
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "-1")
    with pytest.raises(ValueError, match="VLLM_CPU_KVCACHE_SPACE='-1'"):
        CacheConfig()


def test_readme_lists_every_declared_variable():
    """README's environment table holds exactly the rows ``python -m vllm.envs`` prints."""
    import pathlib

    from vllm import envs

    readme = (pathlib.Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    rows = [r for r in envs.describe().splitlines() if r.startswith("| `")]
    assert len(rows) == len(envs.ENV_VARS)
    missing = [r for r in rows if r not in readme.splitlines()]
    assert not missing, "README lacks:\n" + "\n".join(missing)
    listed = [r for r in readme.splitlines() if r.startswith("| `") and "` | " in r]
    names = {r.split("`")[1] for r in rows}
    extra = [
        r
        for r in listed
        if r.split("`")[1].isupper()
        and r.split("`")[1] not in names
        and r.split("`")[1].startswith(("VLLM_", "OMP_", "RAY_", "TRITON_"))
    ]
    assert not extra, "README lists undeclared variables:\n" + "\n".join(extra)
