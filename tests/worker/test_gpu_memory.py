"""The KV budget of one engine on a CUDA device (vllm/worker/gpu_memory.py), from the
numbers torch reports, for one engine alone, two engines sharing a device and a device
crowded by another process."""

from vllm.worker.gpu_memory import kv_budget_bytes, kv_room_bytes, non_torch_bytes

GiB = 2**30
TOTAL = 140 * GiB
CONTEXT = GiB // 2  # this process's CUDA context, there before the worker's snapshot


def _budget(others: int, util: float, weights: int, activations: int, graphs: int = GiB,
            added: int = 0):  # fmt: skip
    """An engine's profile: ``others`` held by other processes throughout, ``added`` bytes
    of non-torch memory allocated by this process after its snapshot."""
    start = non_torch_bytes(TOTAL - others - CONTEXT, TOTAL, 0)  # init_device: no tensors yet
    free = TOTAL - others - CONTEXT - added - weights  # after the forward and empty_cache
    return kv_budget_bytes(TOTAL, free, weights, util, weights + activations, graphs, start)


def test_alone_the_share_is_utilization_minus_own_needs():
    budget, charged = _budget(0, 0.9, weights=16 * GiB, activations=2 * GiB, added=GiB // 4)
    assert charged == GiB // 4  # the context was there at the snapshot: not charged
    assert budget == int(0.9 * TOTAL - 18 * GiB - GiB // 4 - GiB)


def test_two_engines_at_0_3_share_a_device():
    """The second engine is not charged for the first one's 0.3 of the device."""
    first, _ = _budget(0, 0.3, weights=GiB, activations=GiB // 2)
    second, charged = _budget(int(0.3 * TOTAL), 0.3, weights=GiB, activations=GiB // 2)
    assert charged == 0 and second == first == int(0.3 * TOTAL - 1.5 * GiB - GiB)


def test_a_crowded_device_bounds_the_cache_by_what_is_free():
    """Another process holds 100 GiB: 0.9 of the device cannot be had, so the cache gets
    what is free minus the forward's activations and the graphs."""
    budget, _ = _budget(100 * GiB, 0.9, weights=16 * GiB, activations=2 * GiB)
    free = TOTAL - 100 * GiB - CONTEXT - 16 * GiB
    assert budget == free - 2 * GiB - GiB
    none_left, _ = _budget(TOTAL - 19 * GiB, 0.9, weights=16 * GiB, activations=2 * GiB)
    assert none_left == 0


def test_without_a_snapshot_everything_outside_torch_is_charged():
    free = TOTAL - 30 * GiB - 16 * GiB
    budget, charged = kv_budget_bytes(TOTAL, free, 16 * GiB, 0.9, 18 * GiB, GiB, None)
    assert charged == 30 * GiB
    assert budget == int(0.9 * TOTAL - 18 * GiB - 30 * GiB - GiB)


def test_an_explicit_kv_size_is_checked_against_the_room_left():
    """kv_cache_memory_bytes ignores the utilization, not the device: the room is what is
    free less the forward's activations and the graphs, as the budget's own bound."""
    free = TOTAL - 100 * GiB - CONTEXT - 16 * GiB  # test_a_crowded_device_...'s device
    room = kv_room_bytes(free, 16 * GiB, 18 * GiB, GiB)
    assert room == free - 2 * GiB - GiB
    crowded, _ = _budget(100 * GiB, 0.9, weights=16 * GiB, activations=2 * GiB)
    assert crowded == room  # what the budget takes when the device is crowded
    assert kv_room_bytes(GiB, 16 * GiB, 20 * GiB, GiB) < 0  # nothing left
