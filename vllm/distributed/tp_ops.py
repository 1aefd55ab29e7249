"""Collectives of the tensor-parallel group (vLLM's names), no-ops at TP = 1.

- :func:`tensor_model_parallel_all_reduce`: sum of every TP rank's partial result (the
  row-parallel layers and the vocab-parallel embedding). ``torch.distributed.all_reduce`` on
  NCCL is capturable, so inside a CUDA graph it is recorded and replayed like a kernel.
- :func:`tensor_model_parallel_gather`: the logit shards of every TP rank concatenated on TP
  rank 0 (the sampling rank of its stage); other ranks get None.
- :func:`tensor_model_parallel_broadcast`: TP rank 0's tensor on every TP rank (the ids
  rank 0 sampled, which every rank's next multi-step pass reads).
- :func:`assert_tp_plan_agreement`: every TP rank of a stage must run the same collectives
  in the same order, so they must agree, step by step, on whether a step replays a CUDA graph
  (and which) or runs eagerly; a disagreement deadlocks. The ranks exchange their plan over
  the host-side (gloo) group and raise on any difference instead.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from vllm.distributed.parallel_state import get_pp_group


def tensor_model_parallel_all_reduce(x: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Reduce ``x`` over the TP group in place and return it (``x`` itself at TP = 1):
    ``op`` "sum" (partial products) or "max" (elementwise maximum, e.g. row maxima).

    Raises:
        KeyError: another ``op``.
    """
    reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op]
    group = get_pp_group()
    if group is None or group.tp_size == 1:
        return x
    dist.all_reduce(x, op=reduce_op, group=group.tp_group)
    return x


def tensor_model_parallel_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor | None:
    """Concatenate every TP rank's ``x`` along ``dim`` on TP rank 0.

    Args:
        x: this rank's shard, the same shape on every rank (e.g. logits [N, vocab / tp]).
        dim: the dimension to concatenate along.

    Returns:
        On TP rank 0 the concatenation (e.g. [N, padded vocab]); None on the other ranks;
        ``x`` itself at TP = 1.
    """
    group = get_pp_group()
    if group is None or group.tp_size == 1:
        return x
    x = x.contiguous()
    dst = group.tp_ranks[0]
    parts = [torch.empty_like(x) for _ in range(group.tp_size)] if group.rank == dst else None
    dist.gather(x, parts, dst=dst, group=group.tp_group)
    return torch.cat(parts, dim=dim) if parts is not None else None


def tensor_model_parallel_broadcast(x: torch.Tensor | None, shape, dtype, device) -> torch.Tensor:
    """TP rank 0's ``x`` on every TP rank of this stage.

    Args:
        x: the tensor on TP rank 0 (ignored elsewhere, may be None there).
        shape, dtype, device: ``x``'s, known to every rank (the other ranks receive into a
            new tensor of them).

    Returns:
        ``x`` on TP rank 0 (and at TP = 1), the received copy on the other ranks.
    """
    group = get_pp_group()
    if group is None or group.tp_size == 1:
        return x
    src = group.tp_ranks[0]
    if group.rank != src:
        x = torch.empty(shape, dtype=dtype, device=device)
    dist.broadcast(x, src=src, group=group.tp_group)
    return x


def assert_tp_plan_agreement(plan: tuple[int, ...]) -> None:
    """Raise unless every TP rank of this stage planned the same step.

    Args:
        plan: small ints describing the step's plan (e.g. virtual engine, mode, graph size
            or -1, padded size); the same length on every rank.

    Raises:
        RuntimeError: naming every rank's plan when two ranks differ.
    """
    group = get_pp_group()
    if group is None or group.tp_size == 1:
        return
    mine = torch.tensor(plan, dtype=torch.int64)  # [len(plan)], host memory
    parts = [torch.empty_like(mine) for _ in range(group.tp_size)]
    dist.all_gather(parts, mine, group=group.tp_cpu_group)
    plans = [tuple(p.tolist()) for p in parts]
    if any(p != plans[0] for p in plans):
        shown = ", ".join(f"rank {r}: {p}" for r, p in zip(group.tp_ranks, plans, strict=True))
        raise RuntimeError(
            f"the tensor-parallel ranks of pipeline stage {group.pp_rank} disagree on the "
            f"step's plan (virtual engine, mode, graph size or -1, padded size): {shown}"
        )
