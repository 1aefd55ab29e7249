"""The executor interface the engine talks to."""

from __future__ import annotations

from abc import ABC, abstractmethod

from vllm.config import EngineConfig
from vllm.sequence import ExecuteModelRequest, SamplerOutput


class ExecutorBase(ABC):
    """Owns the workers of one engine: starts them, sizes the KV cache, runs steps.

    After construction ``config.cache_config.num_gpu_blocks`` holds the blocks per virtual
    engine (the same on every stage).
    """

    def __init__(self, config: EngineConfig):
        self.config = config
        self._init_executor()

    @abstractmethod
    def _init_executor(self) -> None:
        """Start workers, load the model, size and allocate the KV caches."""

    @abstractmethod
    def execute_model(self, request: ExecuteModelRequest) -> SamplerOutput | None:
        """Run one step and return the last stage's sampler output."""

    def free_sequences(self, seq_ids: list[int]) -> None:
        """Drop per-sequence worker state (seeded generators) of finished sequences."""
        return None

    def decode_step_counters(self) -> dict:
        """Counters of graph-replayed and eager decode steps (see graph_runner)."""
        return {}

    def shutdown(self) -> None:
        """Stop workers; idempotent."""
        return None
