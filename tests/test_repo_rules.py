"""Repository rules that hold for every file: environment variables are read only through
vllm/envs.py, and no text narrates how the project was built."""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _env_reads(path: pathlib.Path) -> list[str]:
    """``os.environ.get(...)``, ``os.getenv(...)`` and ``os.environ[...]`` loads in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func
            if target.attr == "getenv" and getattr(target.value, "id", None) == "os":
                found.append(f"{path}:{node.lineno}: os.getenv")
            if target.attr in ("get", "items") and _is_os_environ(target.value):
                found.append(f"{path}:{node.lineno}: os.environ.{target.attr}")
        if (
            isinstance(node, ast.Subscript)
            and _is_os_environ(node.value)
            and isinstance(node.ctx, ast.Load)
        ):
            found.append(f"{path}:{node.lineno}: os.environ[...]")
        if isinstance(node, ast.Compare) and any(_is_os_environ(c) for c in node.comparators):
            found.append(f"{path}:{node.lineno}: ... in os.environ")
    return found


def _is_os_environ(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "environ"
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
    )


def test_environment_is_read_only_in_envs_py():
    """Every VLLM_* switch is declared once in vllm/envs.py; a module that reads os.environ
    itself bypasses the declared parser, default and README entry."""
    reads = []
    for path in sorted((ROOT / "vllm").rglob("*.py")):
        if path.name == "envs.py" and path.parent.name == "vllm":
            continue
        reads += _env_reads(path)
    assert reads == [], "os.environ read outside vllm/envs.py:\n" + "\n".join(reads)


def test_env_reader_finds_each_form(tmp_path):
    """The scanner above must see every form of read it claims to catch."""
    f = tmp_path / "m.py"
    f.write_text(
        "import os\n"
        "a = os.environ.get('X')\n"
        "b = os.getenv('X')\n"
        "c = os.environ['X']\n"
        "d = 'X' in os.environ\n"
        "os.environ['Y'] = '1'\n"
    )
    assert len(_env_reads(f)) == 4


NARRATION = re.compile(r"session [0-9]|call[0-9]{2}|\.sh call", re.IGNORECASE)


def test_no_development_narration():
    """README, docs, benchmarks, vllm and tests describe the product, not the sessions and
    one-off runs that built it (git keeps the history)."""
    hits = []
    paths = [ROOT / "README.md"]
    for folder in ("docs", "vllm", "benchmarks", "tests"):
        paths += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md", ".sh")]
    for path in paths:
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if NARRATION.search(line) and "NARRATION" not in line:
                hits.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()[:100]}")
    assert hits == [], "\n".join(hits)
