"""Per-request Prometheus histograms, the preemption counter and the upstream (V1) metric
names: exact values from known timestamps, then a tight-cache AsyncLLMEngine run whose
metrics must agree with the scheduler's own counters and the streamed outputs."""

import asyncio
import re
from types import SimpleNamespace

import pytest

from vllm.engine.metrics import EngineMetrics, StepStats
from vllm.engine.request_metrics import FinishedRequest, one_two_five_buckets
from vllm.sampling_params import SamplingParams
from vllm.sequence import RequestMetrics


def _series(text: str) -> dict[str, float]:
    """{name (with labels other than model_name): value} of a Prometheus text page."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, value = line.rsplit(" ", 1)
        name = re.sub(r'model_name="[^"]*",?', "", name).replace("{}", "").replace(",}", "}")
        out[name] = float(value)
    return out


def _group(output_lens, prompt_len=7, n=2, max_tokens=10, **times):
    seqs = [
        SimpleNamespace(get_output_len=lambda k=k: k, get_prompt_len=lambda: prompt_len)
        for k in output_lens
    ]
    params = SamplingParams(n=n, max_tokens=max_tokens)
    return SimpleNamespace(seqs=seqs, sampling_params=params, metrics=RequestMetrics(**times),
                           pooling_params=None)  # fmt: skip


def test_one_two_five_buckets():
    assert one_two_five_buckets(1) == [1]
    assert one_two_five_buckets(100) == [1, 2, 5, 10, 20, 50, 100]
    assert one_two_five_buckets(2048) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]


def test_finished_request_intervals_and_histograms():
    group = _group(
        [4, 9],
        arrival_time=100.0,
        first_scheduled_time=100.5,
        first_token_time=101.25,
        last_token_time=103.25,
        finished_time=103.5,
    )
    req = FinishedRequest.from_group(group, "length")
    assert (req.queue, req.prefill, req.decode, req.inference, req.e2e) == (
        0.5, 0.75, 2.0, 2.75, 3.5,
    )  # fmt: skip
    assert (req.prompt_tokens, req.generation_tokens, req.max_generation_tokens) == (7, [4, 9], 9)
    # Aborted while queued: only e2e and the token counts.
    queued = FinishedRequest.from_group(_group([0, 0], arrival_time=10.0), "abort", now=12.0)
    assert queued.e2e == 2.0 and queued.queue is None and queued.decode is None

    em = EngineMetrics("m")
    em.record(StepStats(finished=[req]))  # before configure(): success and e2e only
    em.configure(64, {"block_size": 16, "num_gpu_blocks": 9})
    em.record(StepStats(finished=[req, queued], preemptions=3))
    em.record(StepStats(preemptions=5))
    s = _series(em.render().decode())
    # each record of ``req`` counts its two sequences (n = 2), as upstream
    assert s['vllm:request_success_total{finished_reason="length"}'] == 4
    assert s['vllm:request_success_total{finished_reason="abort"}'] == 2
    assert s["vllm:e2e_request_latency_seconds_sum"] == 3.5 + 3.5 + 2.0
    assert s["vllm:request_queue_time_seconds_count"] == 1
    assert s["vllm:request_queue_time_seconds_sum"] == 0.5
    assert s["vllm:request_prefill_time_seconds_sum"] == 0.75
    assert s["vllm:request_decode_time_seconds_sum"] == 2.0
    assert s["vllm:request_inference_time_seconds_sum"] == 2.75
    assert s["vllm:request_time_per_output_token_seconds_sum"] == 0.25  # 2 s / (9 - 1)
    assert s["vllm:request_prompt_tokens_sum"] == 14 and s["vllm:request_prompt_tokens_count"] == 2
    assert s["vllm:request_generation_tokens_sum"] == 13
    # one observation per sequence (as upstream): 4 and 9, then the abort's two 0s
    assert s["vllm:request_generation_tokens_count"] == 4
    assert s['vllm:request_generation_tokens_bucket{le="5.0"}'] == 3
    assert s['vllm:request_max_num_generation_tokens_bucket{le="10.0"}'] == 2
    assert s['vllm:request_max_num_generation_tokens_bucket{le="5.0"}'] == 1  # the abort's 0
    assert s['vllm:request_params_n_bucket{le="2.0"}'] == 2
    assert s["vllm:request_params_max_tokens_sum"] == 20
    assert s["vllm:num_preemptions_total"] == 5  # cumulative 3, then 5
    assert s['vllm:cache_config_info{block_size="16",num_gpu_blocks="9"}'] == 1
    assert "process_cpu_seconds_total" in s and "python_gc_objects_collected_total" in str(s)


@pytest.mark.forked
def test_engine_metrics_agree_with_scheduler_and_outputs(tiny_llama_dir):
    """Eight requests through a 14-block cache (so some are preempted): the preemption
    counter equals the schedulers' count, the per-request histograms count every request,
    their generation tokens equal generation_tokens_total and the streamed token counts, and
    the V1 names equal the older ones."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.engine.async_llm_engine import AsyncLLMEngine

    args = EngineArgs(
        model=tiny_llama_dir, device="cpu", block_size=4, num_gpu_blocks_override=13,
        max_num_seqs=8, max_model_len=48, enable_prefix_caching=False,
    )  # fmt: skip
    prompts = [{"prompt_token_ids": [10 + i, 20 + i, 30 + i, 40 + i, 50 + i]} for i in range(8)]
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)

    async def main():
        engine = AsyncLLMEngine(args, log_requests=False)
        try:

            async def one(i):
                last = None
                async for out in engine.generate(prompts[i], params, f"r{i}"):
                    last = out
                return len(last.outputs[0].token_ids)

            lens = await asyncio.gather(*(one(i) for i in range(8)))
            preempted = sum(s.num_cumulative_preemption for s in engine.engine.schedulers)
            blocks = engine.engine.config.cache_config.num_gpu_blocks
            return lens, preempted, blocks, engine.metrics.render().decode()
        finally:
            await engine.shutdown()

    lens, preempted, blocks, text = asyncio.run(main())
    s = _series(text)
    assert lens == [20] * 8
    assert preempted > 0, "no preemption: the counter is not exercised"
    assert s["vllm:num_preemptions_total"] == preempted
    for name in ("queue_time_seconds", "prefill_time_seconds", "decode_time_seconds",
                 "inference_time_seconds", "prompt_tokens", "generation_tokens"):  # fmt: skip
        assert s[f"vllm:request_{name}_count"] == 8, name
    assert s["vllm:request_prompt_tokens_sum"] == 40
    assert s["vllm:request_generation_tokens_sum"] == 160 == s["vllm:generation_tokens_total"]
    assert s["vllm:request_params_max_tokens_sum"] == 160
    assert (
        s["vllm:inter_token_latency_seconds_count"] == s["vllm:time_per_output_token_seconds_count"]
    )
    assert s["vllm:kv_cache_usage_perc"] == s["vllm:gpu_cache_usage_perc"]
    assert s["vllm:prefix_cache_queries_total"] == s["vllm:gpu_prefix_cache_queries_total"]
    info = [k for k in s if k.startswith("vllm:cache_config_info")]
    assert blocks and info and f'num_gpu_blocks="{blocks}"' in info[0], info
    assert 'block_size="4"' in info[0] and 'enable_prefix_caching="False"' in info[0], info


@pytest.mark.forked
def test_generation_tokens_count_what_is_appended_under_speculation(tiny_llama_dir):
    """The target as its own draft (every proposal accepted: 5 tokens per step with k = 4)
    and max_tokens 7: the last step samples more tokens than the budget keeps, and
    generation_tokens_total counts the kept ones (4 x 7), as the request histogram does."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.engine.async_llm_engine import AsyncLLMEngine

    args = EngineArgs(model=tiny_llama_dir, device="cpu", max_model_len=128,
                      speculative_model=tiny_llama_dir, num_speculative_tokens=4)  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True)

    async def main():
        engine = AsyncLLMEngine(args, log_requests=False)
        try:

            async def one(i):
                prompt = {"prompt_token_ids": [10 + i, 20 + i, 30 + i]}
                return [o async for o in engine.generate(prompt, params, f"s{i}")][-1]

            outs = await asyncio.gather(*(one(i) for i in range(4)))
            return outs, engine.engine.spec_decode_metrics(), engine.metrics.render().decode()
        finally:
            await engine.shutdown()

    outs, spec, text = asyncio.run(main())
    assert [len(o.outputs[0].token_ids) for o in outs] == [7] * 4
    assert spec["num_accepted_tokens"] == spec["num_draft_tokens"] > 0, spec
    s = _series(text)
    assert s["vllm:generation_tokens_total"] == 28 == s["vllm:request_generation_tokens_sum"]


@pytest.mark.forked
def test_request_success_counts_each_sequence_with_its_reason(tiny_llama_dir):
    """n = 2 where one sequence hits a stop token and the other runs to max_tokens: the
    request adds one "stop" and one "length" to vllm:request_success_total and one
    observation per sequence to vllm:request_generation_tokens, as upstream counts finished
    sequences. Guards: one count per request, with the first sequence's reason only (the
    other sequence's reason lost), and one generation-tokens observation of the sum."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.engine.async_llm_engine import AsyncLLMEngine

    args = EngineArgs(model=tiny_llama_dir, device="cpu", max_model_len=64)
    prompt = {"prompt_token_ids": [10, 20, 30, 40]}

    async def main():
        engine = AsyncLLMEngine(args, log_requests=False)
        try:

            async def run(rid, **kw):
                params = SamplingParams(n=2, seed=7, max_tokens=6, ignore_eos=True, **kw)
                return [o async for o in engine.generate(prompt, params, rid)][-1]

            # seeded: the same two sequences again, so a token only the first one samples
            # (after its first token) stops it and leaves the second to max_tokens
            first = await run("probe")
            a, b = (list(o.token_ids) for o in first.outputs)
            stop = next(t for t in a[1:] if t not in b)
            out = await run("mixed", stop_token_ids=[stop])
            return first, out, engine.metrics.render().decode()
        finally:
            await engine.shutdown()

    first, out, text = asyncio.run(main())
    assert [o.finish_reason for o in first.outputs] == ["length", "length"]
    assert sorted(o.finish_reason for o in out.outputs) == ["length", "stop"]
    s = _series(text)
    assert s['vllm:request_success_total{finished_reason="length"}'] == 3
    assert s['vllm:request_success_total{finished_reason="stop"}'] == 1
    # vllm:request_generation_tokens: one observation per sequence, as upstream
    lens = [len(o.token_ids) for r in (first, out) for o in r.outputs]
    assert s["vllm:request_generation_tokens_count"] == 4
    assert s["vllm:request_generation_tokens_sum"] == sum(lens) == s["vllm:generation_tokens_total"]
    assert s["vllm:request_max_num_generation_tokens_count"] == 2
