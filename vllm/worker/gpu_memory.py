"""How much of a CUDA device the KV cache of one engine may take.

``gpu_memory_utilization`` is this engine's share of the device, as in upstream vLLM (since
0.6.4, and in V1): the KV cache gets ``total x utilization`` minus what this process itself
needs besides it (the profiling forward's torch peak, weights included; memory this
process allocated outside torch since its worker started, e.g. cuBLAS workspaces and NCCL
buffers; the CUDA graphs' estimate). Memory other processes hold is not charged to it, so
two engines at 0.3 each can share one GPU. What is free right now bounds the result, so a
device crowded by other processes gives a smaller cache rather than an out-of-memory error
when the cache is allocated.
"""

from __future__ import annotations


def non_torch_bytes(free: int, total: int, reserved: int) -> int:
    """Bytes in use on the device outside this process's torch allocator: every other
    process's memory plus this process's CUDA context and non-torch allocations.

    Args:
        free, total: ``torch.cuda.mem_get_info`` (bytes).
        reserved: ``torch.cuda.memory_reserved`` of this process (bytes).
    """
    return total - free - reserved


def kv_budget_bytes(
    total: int,
    free: int,
    reserved: int,
    utilization: float,
    peak: int,
    graphs: int,
    non_torch_at_start: int | None,
) -> tuple[int, int]:
    """The KV cache's bytes on this device, and the non-torch bytes charged to this engine.

    Args:
        total, free: ``torch.cuda.mem_get_info`` after the profiling forward and
            ``empty_cache`` (bytes).
        reserved: this process's ``torch.cuda.memory_reserved`` then (weights included).
        utilization: ``gpu_memory_utilization``, in (0, 1].
        peak: ``torch.cuda.max_memory_allocated`` over the profiling forward (bytes).
        graphs: the CUDA graphs' estimated memory (bytes).
        non_torch_at_start: :func:`non_torch_bytes` when the worker took its device, or
            None when unknown (then everything outside torch is charged, other processes'
            memory included).

    Returns:
        (budget, charged): ``min(total x utilization - peak - charged - graphs, free -
        activations - graphs)``, at least 0, where ``activations = peak - reserved`` (the
        forward's transient memory, which must stay available beside the cache), and
        ``charged``, the non-torch bytes this process added since ``non_torch_at_start``
        (never negative).
    """
    now = non_torch_bytes(free, total, reserved)
    charged = now if non_torch_at_start is None else max(0, now - non_torch_at_start)
    share = total * utilization - peak - charged - graphs
    return max(0, int(min(share, kv_room_bytes(free, reserved, peak, graphs)))), charged


def kv_room_bytes(free: int, reserved: int, peak: int, graphs: int) -> int:
    """The most KV-cache bytes the device has room for, whatever the utilization: ``free
    - activations - graphs`` (arguments as :func:`kv_budget_bytes`'), where ``activations
    = peak - reserved`` is the forward's transient memory. What an explicit
    ``kv_cache_memory_bytes`` is checked against; may be negative."""
    return int(free - max(0, peak - reserved) - graphs)
