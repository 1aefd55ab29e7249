"""Checks that a model can be split over ``tensor_parallel_size`` ranks (before any process
starts), run by :meth:`vllm.config.EngineConfig.verify`.

What must divide (messages name the numbers):

- query heads by tp (each rank holds ``heads / tp``);
- KV heads by tp, or tp by KV heads (then each KV head is replicated on ``tp / kv_heads``
  ranks);
- the MLP intermediate size by tp (``intermediate_size``; for mixture-of-experts layers
  ``moe_intermediate_size`` where the config has it: experts are split along it);
- not the vocabulary: it is padded to a multiple of tp (vllm/model_executor/layers/
  vocab_embedding.py).

And the world (tp x pp ranks) must fit the devices: on CUDA with the mp executor (one host)
``tp * pp`` must not exceed the visible GPUs. (Ray places ranks over its cluster's GPUs and
reports a shortfall when it reserves them.)
"""

from __future__ import annotations


def verify_tensor_parallel(hf_config, tp: int) -> None:
    """Raise unless the model's heads and widths split over ``tp`` ranks.

    Args:
        hf_config: the transformers config.
        tp: tensor_parallel_size (>= 1).

    Raises:
        ValueError: naming the quantity, its value and tp.
    """
    if tp == 1:
        return
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    if heads % tp:
        raise ValueError(
            f"num_attention_heads={heads} is not divisible by tensor_parallel_size={tp}."
        )
    if kv_heads % tp and tp % kv_heads:
        raise ValueError(
            f"num_key_value_heads={kv_heads} and tensor_parallel_size={tp}: one must divide "
            "the other (KV heads split over the ranks, or each replicated on tp / kv_heads "
            "ranks)."
        )
    for name in ("intermediate_size", "moe_intermediate_size"):
        size = getattr(hf_config, name, None)
        if size is not None and size % tp:
            raise ValueError(f"{name}={size} is not divisible by tensor_parallel_size={tp}.")


def verify_world_fits_devices(
    tp: int, pp: int, device: str, backend: str, num_devices: int
) -> None:
    """Raise when the mp executor's ``tp * pp`` ranks need more GPUs than are visible.

    Args:
        tp, pp: tensor- and pipeline-parallel sizes.
        device: "cuda" or "cpu" (CPU ranks share the host: no limit).
        backend: the distributed executor backend ("uni", "mp", "ray").
        num_devices: visible CUDA devices.

    Raises:
        ValueError: naming the world size, both factors and the device count.
    """
    world = tp * pp
    if device != "cuda" or backend == "ray" or world <= num_devices:
        return
    raise ValueError(
        f"tensor_parallel_size={tp} x pipeline_parallel_size={pp} = {world} ranks, one GPU "
        f"each, but only {num_devices} CUDA devices are visible."
    )
