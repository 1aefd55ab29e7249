"""``vllm collect-env``: the facts a bug report needs, one ``name: value`` line each.

Sections: the system (OS, Python, CPU count, memory), the GPUs (torch's CUDA build, driver,
each device's name, memory and compute capability, ``CUDA_VISIBLE_DEVICES``), the versions
of this package and the libraries it runs on (missing ones say "not installed"), and the
``VLLM_*`` variables set in the environment (values of credentials, such as
``VLLM_API_KEY``, hidden). Nothing is sent anywhere.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys

from vllm import envs

PACKAGES = (
    "vllm", "torch", "triton", "flashinfer-python", "transformers", "tokenizers",
    "safetensors", "gguf", "xgrammar", "ray", "fastapi", "uvicorn", "pydantic", "numpy",
    "prometheus-client",
)  # fmt: skip


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _driver() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError, IndexError):
        return "no nvidia-smi"


# A variable whose name has one of these parts holds a credential: its value is hidden.
_SECRET_PARTS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "ACCESS", "CREDENTIAL")


def _shown(name: str, value: str) -> str:
    """``value``, or "(set, hidden)" for a credential (the report is meant to be pasted)."""
    return "(set, hidden)" if any(p in name.upper() for p in _SECRET_PARTS) else value


def collect() -> list[tuple[str, str]]:
    """(name, value) rows of the report, in print order."""
    import psutil
    import torch

    rows = [
        ("OS", platform.platform()),
        ("Python", sys.version.split()[0]),
        ("CPU cores", str(os.cpu_count())),
        ("Memory (GiB)", f"{psutil.virtual_memory().total / 2**30:.1f}"),
        ("torch CUDA build", str(torch.version.cuda)),
        ("CUDA available", str(torch.cuda.is_available())),
    ]
    if torch.cuda.is_available():
        rows.append(("NVIDIA driver", _driver()))
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            rows.append(
                (f"GPU {i}", f"{p.name}, {p.total_memory / 2**30:.1f} GiB, sm_{p.major}{p.minor}")
            )
    rows.append(("CUDA_VISIBLE_DEVICES", envs.CUDA_VISIBLE_DEVICES or "(not set)"))
    rows += [(name, _version(name)) for name in PACKAGES]
    rows += [(k, _shown(k, v)) for k, v in envs.vllm_variables_set()]
    return rows


def main() -> int:
    """Print the report; returns 0."""
    rows = collect()
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}} : {value}")
    return 0
