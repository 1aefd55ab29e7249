"""vllm:decode_steps_total labels: the virtual engine, never the pipeline rank."""

from vllm.engine.decode_step_metrics import flatten_decode_counters

SNAP = {
    "graph": {0: {1: 3, 2: 4}, 1: {4: 2}},
    "eager": {0: {"prefill": 5, "too_big": 1}, 1: {"prefill": 2}},
    "piecewise_graph": {0: {16: 2, 512: 1}},
}
EXPECTED = {("graph", "0"): 7.0, ("graph", "1"): 2.0, ("eager", "0"): 1.0,
            ("piecewise_graph", "0"): 3.0}  # fmt: skip


def test_single_stage_snapshot():
    assert flatten_decode_counters(SNAP) == EXPECTED


def test_per_stage_snapshots_count_each_step_once_by_virtual_engine():
    """PP=2: both stages ran the same steps; rank 1 must not become virtual engine 1 and
    the steps must not be doubled."""
    assert flatten_decode_counters({0: SNAP, 1: SNAP}) == EXPECTED


def test_empty_and_prefill_only():
    assert flatten_decode_counters({}) == {}
    assert flatten_decode_counters({0: {}, 1: {}}) == {}
    assert flatten_decode_counters({"eager": {0: {"prefill": 3}}}) == {}
