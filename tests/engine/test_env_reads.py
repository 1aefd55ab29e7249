"""Environment variables are read through vllm/envs.py only (declared name, parser, default)."""

import ast
import pathlib

import pytest

import vllm

ROOT = pathlib.Path(vllm.__file__).parent

# Modules that once read os.environ directly; each must now go through vllm.envs.
CHECKED = [
    "config.py",
    "executor/ray_executor.py",
    "distributed/utils.py",
    "entrypoints/openai/api_server.py",
    "engine/llm_engine.py",
    "worker/worker.py",
    "worker/ray_worker.py",
]


def _environ_reads(tree: ast.AST) -> list[int]:
    """Line numbers of os.getenv(...), os.environ.get(...) and os.environ[...] loads."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if f.attr == "getenv" and isinstance(f.value, ast.Name) and f.value.id == "os":
                lines.append(node.lineno)
            if f.attr == "get" and ast.unparse(f.value) == "os.environ":
                lines.append(node.lineno)
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            if ast.unparse(node.value) == "os.environ":
                lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("rel", CHECKED)
def test_no_direct_environ_reads(rel):
    path = ROOT / rel
    lines = _environ_reads(ast.parse(path.read_text()))
    assert lines == [], f"{rel} reads os.environ at lines {lines}; use vllm.envs"


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
