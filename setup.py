"""Packaging for the `vllm` engine.

torch is deliberately not in ``install_requires``: a host that already has the right torch
(an offline GPU host, say) installs with ``pip install --no-build-isolation --no-deps -e .``;
CPU machines get the pinned CPU build through ``pip install -e .[cpu]`` or
``requirements-cpu.txt``.
"""

import os
import re

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def read_requirements(name: str) -> list[str]:
    """Return the requirement lines of ``name``, skipping comments, blanks and ``-r``."""
    reqs = []
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith("-"):
                reqs.append(line)
    return reqs


def read_version() -> str:
    """Read ``__version__`` from vllm/version.py without importing the package."""
    with open(os.path.join(ROOT, "vllm", "version.py"), encoding="utf-8") as f:
        match = re.search(r'^__version__\s*=\s*"([^"]+)"', f.read(), re.MULTILINE)
    if match is None:
        raise RuntimeError('vllm/version.py has no __version__ = "..." line')
    return match.group(1)


def read_readme() -> str:
    path = os.path.join(ROOT, "README.md")
    if not os.path.exists(path):
        return ""
    with open(path, encoding="utf-8") as f:
        return f.read()


setup(
    name="vllm",
    version=read_version(),
    description="A compact vLLM V0-shaped inference engine for CPU and CUDA",
    long_description=read_readme(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(
        exclude=("tests", "tests.*", "benchmarks", "benchmarks.*", "examples", "examples.*")
    ),
    install_requires=read_requirements("requirements-common.txt"),
    extras_require={
        "cpu": ["torch==2.13.0"],
        "cuda": ["flashinfer-python==0.7.2.post1"],
        "ray": read_requirements("requirements-ray.txt"),
        "test": read_requirements("requirements-test.txt"),
    },
    entry_points={"console_scripts": ["vllm = vllm.entrypoints.cli:main"]},
)
