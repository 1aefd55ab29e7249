"""Version of the `vllm` package (read by setup.py without importing torch)."""

__version__ = "0.1.0"
