"""Per-step token metrics: prompt and generation tokens counted apart, prompt + generation
tokens of each step in the ``vllm:iteration_tokens_total`` histogram, and both rates in the
stats log line (a chunked-prefill step holds both kinds)."""

import logging

from vllm.engine.metrics import EngineMetrics, StepStats


def test_iteration_tokens_and_log_line(caplog):
    em = EngineMetrics("m")
    em.record(StepStats(prompt_tokens=14, generation_tokens=2))  # a chunk beside 2 decodes
    em.record(StepStats(prompt_tokens=0, generation_tokens=3))  # decodes only
    em.record(StepStats())  # nothing ran: not an iteration
    text = em.render().decode()
    assert 'vllm:prompt_tokens_total{model_name="m"} 14.0' in text
    assert 'vllm:generation_tokens_total{model_name="m"} 5.0' in text
    assert 'vllm:iteration_tokens_total_count{model_name="m"} 2.0' in text
    assert 'vllm:iteration_tokens_total_sum{model_name="m"} 19.0' in text
    assert 'vllm:iteration_tokens_total_bucket{le="8.0",model_name="m"} 1.0' in text
    assert 'vllm:iteration_tokens_total_bucket{le="16.0",model_name="m"} 2.0' in text
    em.stats_log._last -= 20.0  # the next record logs: 20 s since the last line
    with caplog.at_level(logging.INFO, logger="vllm.engine.metrics"):
        em.record(StepStats(prompt_tokens=6, generation_tokens=1))
    line = caplog.records[-1].getMessage()
    # 20 prompt and 6 generation tokens over the ~20 s interval
    assert "Avg prompt throughput: 1.0 tokens/s" in line, line
    assert "Avg generation throughput: 0.3 tokens/s" in line, line
