"""Spec-decode counters and their Prometheus export."""

from vllm.engine.metrics import EngineMetrics, StepStats
from vllm.spec_decode.metrics import SpecDecodeMetrics


def test_snapshot_ratios():
    m = SpecDecodeMetrics(k=4)
    assert m.snapshot()["draft_acceptance_rate"] == 0.0
    m.record(num_seqs=2, draft=8, accepted=5, emitted=7)
    m.record(num_seqs=1, draft=3, accepted=0, emitted=1)
    s = m.snapshot()
    assert (s["num_draft_tokens"], s["num_accepted_tokens"], s["num_emitted_tokens"]) == (11, 5, 8)
    assert s["draft_acceptance_rate"] == 5 / 11
    assert s["system_efficiency"] == 8 / (3 * 5)


def test_prometheus_export_uses_deltas():
    em = EngineMetrics("m")
    m = SpecDecodeMetrics(k=2)
    m.record(1, 2, 1, 2)
    em.record(StepStats(spec_decode=m.snapshot()))
    m.record(1, 2, 2, 3)
    em.record(StepStats(spec_decode=m.snapshot()))
    text = em.render().decode()
    assert 'vllm:spec_decode_num_draft_tokens_total{model_name="m"} 4.0' in text
    assert 'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 3.0' in text
    assert 'vllm:spec_decode_num_emitted_tokens_total{model_name="m"} 5.0' in text
    assert 'vllm:spec_decode_draft_acceptance_rate{model_name="m"} 0.75' in text
