"""The periodic stats line: its numbers, idle lines demoted to DEBUG, ``--disable-log-stats``
(EngineMetrics without a line) and the offline ``LLM(disable_log_stats=False)``."""

import logging

from tests.utils import fork_new_process_for_each_test
from vllm.engine.metrics import EngineMetrics, StepStats
from vllm.engine.stats_log import ThroughputLog

LOGGER = "vllm.engine.metrics"


def _lines(caplog) -> list[tuple[int, str]]:
    return [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.name == LOGGER and "Avg prompt throughput" in r.getMessage()
    ]


def test_line_numbers_and_idle_lines_go_to_debug(caplog, monkeypatch):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    clock = iter([100.0, 110.0, 120.0, 130.0, 140.0, 150.0])
    monkeypatch.setattr("vllm.engine.stats_log.time.monotonic", lambda: next(clock))
    log = ThroughputLog(interval_s=10.0)  # starts at t=100
    log.add(200, 50)
    log.add(0, 30)
    log.log(3, 1, 0.25, 0.5)  # t=110: 200 / 10 s and 80 / 10 s
    log.log(0, 0, 0.0, 0.5)  # t=120: idle, the first such line is still INFO
    log.log(0, 0, 0.0, 0.5)  # t=130: idle again: DEBUG
    log.add(0, 10)
    log.log(1, 0, 0.1, 0.5)  # t=140: tokens flow again: INFO
    levels = [lvl for lvl, _ in _lines(caplog)]
    assert levels == [logging.INFO, logging.INFO, logging.DEBUG, logging.INFO]
    first = _lines(caplog)[0][1]
    assert first == (
        "Avg prompt throughput: 20.0 tokens/s, Avg generation throughput: 8.0 tokens/s, "
        "Running: 3 reqs, Waiting: 1 reqs, GPU KV cache usage: 25.0%, "
        "Prefix cache hit rate: GPU: 50.00%"
    )
    assert "Avg generation throughput: 1.0 tokens/s" in _lines(caplog)[3][1]


def test_due_after_the_interval(monkeypatch):
    now = [0.0]
    monkeypatch.setattr("vllm.engine.stats_log.time.monotonic", lambda: now[0])
    log = ThroughputLog(interval_s=10.0)
    now[0] = 9.9
    assert not log.due()
    now[0] = 10.0
    assert log.due()


def test_engine_metrics_line_only_without_disable_log_stats(caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    quiet = EngineMetrics("m", log_stats=False)
    assert quiet.stats_log is None
    quiet.record(StepStats(num_running=1, prompt_tokens=5, generation_tokens=1))
    assert _lines(caplog) == []
    loud = EngineMetrics("m")
    loud.stats_log.interval_s = 0.0
    loud.record(StepStats(num_running=1, prompt_tokens=5, generation_tokens=1))
    assert len(_lines(caplog)) == 1
    # the metrics themselves are kept either way
    assert b"vllm:prompt_tokens_total" in quiet.render()


def test_serve_disable_log_stats_reaches_the_metrics(monkeypatch):
    """build_engine hands --disable-log-stats to the server's EngineMetrics."""
    from vllm.entrypoints import cli
    from vllm.entrypoints.openai import api_server

    seen = {}

    class FakeEngine:
        def __init__(self, engine_args, metrics, **kw):
            seen["metrics"] = metrics

    monkeypatch.setattr(api_server, "AsyncLLMEngine", FakeEngine)
    for flags, expect_log in (([], True), (["--disable-log-stats"], False)):
        args = cli.make_parser().parse_args(["serve", "/m", *flags])
        args.model_is_default, args.lora_requests = False, []
        api_server.build_engine(args, None)
        assert (seen["metrics"].stats_log is not None) is expect_log, flags


@fork_new_process_for_each_test
def test_offline_llm_logs_only_when_asked(tiny_llama_dir):
    from vllm import LLM, SamplingParams

    quiet = LLM(tiny_llama_dir, device="cpu", max_model_len=128)
    assert quiet.llm_engine.stats_log is None  # LLM's default: disable_log_stats=True
    del quiet
    llm = LLM(tiny_llama_dir, device="cpu", max_model_len=128, disable_log_stats=False)
    log = llm.llm_engine.stats_log
    log.interval_s = 0.0  # a line after every step
    records = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())
    logging.getLogger(LOGGER).addHandler(handler)
    logging.getLogger(LOGGER).setLevel(logging.DEBUG)
    sp = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    llm.generate(["hello there", "one two three"], sp, use_tqdm=False)
    lines = [m for m in records if "Avg prompt throughput" in m]
    assert lines, records
    assert any("Running: 2 reqs" in m for m in lines), lines


@fork_new_process_for_each_test
def test_offline_log_counts_the_tokens_kept(tiny_llama_dir):
    """With 8 steps per call a stop token ends a sequence inside a call: the stats line's
    generation tokens are the tokens the requests kept, not the call's rows (the tokens
    computed after the stop are dropped)."""
    from vllm import LLM, SamplingParams

    llm = LLM(tiny_llama_dir, device="cpu", max_model_len=128, disable_log_stats=False,
              num_scheduler_steps=8)  # fmt: skip
    prompts = [{"prompt_token_ids": [5, 6, 7, 8]}, {"prompt_token_ids": [100, 200, 300]}]
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    ref = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
    stop = ref[0][3]
    assert stop not in ref[0][:3] and stop not in ref[1], ref
    counted = [0, 0]
    add = llm.llm_engine.stats_log.add

    def counting(prompt_tokens, generation_tokens):
        counted[0] += prompt_tokens
        counted[1] += generation_tokens
        add(prompt_tokens, generation_tokens)

    llm.llm_engine.stats_log.add = counting
    stopping = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                              stop_token_ids=[stop])  # fmt: skip
    outs = llm.generate(prompts, stopping, use_tqdm=False)
    kept = [len(o.outputs[0].token_ids) for o in outs]
    assert kept == [4, 12], kept
    assert counted == [7, 16], counted
