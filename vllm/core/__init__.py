"""Scheduling and KV-cache block accounting, free of torch (tested on CPU alone)."""

from vllm.core.block_manager import AllocStatus, BlockSpaceManager
from vllm.core.scheduler import Scheduler, SchedulerOutputs

__all__ = ["AllocStatus", "BlockSpaceManager", "Scheduler", "SchedulerOutputs"]
