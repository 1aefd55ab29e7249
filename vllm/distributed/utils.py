"""Pipeline-parallel layer partition.

A model of ``num_layers`` decoder layers is cut into ``pp_size`` contiguous stages. Stage
``r`` owns layers ``[start, end)``. By default the first ``num_layers % pp_size`` stages take
one extra layer (61 layers on 8 stages -> 8,8,8,8,8,7,7,7). The environment variable
``VLLM_PP_LAYER_PARTITION="4,3,3"`` overrides the sizes (same convention as upstream vLLM).
"""

from vllm import envs

PP_PARTITION_ENV = "VLLM_PP_LAYER_PARTITION"


def get_pp_partition(num_layers: int, pp_size: int) -> list[int]:
    """Number of layers per pipeline stage.

    Args:
        num_layers: total decoder layers of the model (>= 1).
        pp_size: number of pipeline stages (>= 1).

    Returns:
        ``pp_size`` positive ints summing to ``num_layers``.

    Raises:
        ValueError: ``pp_size < 1``; fewer layers than stages; an env override
            (``VLLM_PP_LAYER_PARTITION``) that is not ``pp_size`` positive ints summing to
            ``num_layers``.
    """
    if pp_size < 1:
        raise ValueError(f"pipeline parallel size must be >= 1, got {pp_size}")
    if num_layers < pp_size:
        raise ValueError(
            f"cannot split {num_layers} layers over {pp_size} pipeline stages: "
            f"every stage needs at least one layer (num_layers >= pp_size)"
        )
    override = envs.VLLM_PP_LAYER_PARTITION
    if override:
        try:
            sizes = [int(part) for part in override.split(",")]
        except ValueError as exc:
            raise ValueError(
                f"{PP_PARTITION_ENV}={override!r} is not a comma-separated list of ints"
            ) from exc
        if len(sizes) != pp_size or sum(sizes) != num_layers or min(sizes) < 1:
            raise ValueError(
                f"{PP_PARTITION_ENV}={override!r} gives {len(sizes)} stages summing to "
                f"{sum(sizes)} layers, but the model has num_layers={num_layers} and "
                f"pp_size={pp_size} (need {pp_size} positive entries summing to {num_layers})"
            )
        return sizes
    base, extra = divmod(num_layers, pp_size)
    return [base + 1 if rank < extra else base for rank in range(pp_size)]


def get_pp_indices(num_layers: int, pp_rank: int, pp_size: int) -> tuple[int, int]:
    """Half-open layer range ``(start, end)`` owned by stage ``pp_rank``.

    Raises:
        ValueError: ``pp_rank`` outside ``[0, pp_size)``, or as :func:`get_pp_partition`.
    """
    if not 0 <= pp_rank < pp_size:
        raise ValueError(f"pp_rank={pp_rank} out of range for pp_size={pp_size}")
    sizes = get_pp_partition(num_layers, pp_size)
    start = sum(sizes[:pp_rank])
    return start, start + sizes[pp_rank]
