"""Attention: the layer models use, and the backends behind it."""

from vllm.attention.backends.abstract import AttentionMetadata, ForwardMode, StepInputs
from vllm.attention.layer import Attention

__all__ = ["Attention", "AttentionMetadata", "ForwardMode", "StepInputs"]
