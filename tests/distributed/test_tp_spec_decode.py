"""Speculative decoding with tensor parallelism on CPU (gloo, mp executor, float32).

Every rank proposes the same tokens (n-gram lookups read the same tokens; the draft's ids
are sampled on TP rank 0 and broadcast) and runs the scoring forward over its shards; TP
rank 0 accepts and returns the step, and broadcasts the accepted counts the draft's cache
bookkeeping needs. So at TP = 2:

- n-gram speculation on a model whose greedy text cycles (every proposal accepted) gives
  the tokens of TP = 1 without speculation, logprobs within 1e-4 (another sum order);
- a draft model gives the tokens of TP = 1 with the same draft, greedy (with logprobs)
  and seeded, and the greedy ones equal TP = 1 without speculation;
- the counters come from TP rank 0 and match TP = 1's;
- a rank that raises fails its step's requests as without speculation.
"""

import pytest

from tests.spec_decode.spec_runs import assert_runs_close, run_token_prompts
from tests.utils import deadline, run_engine_script, stage_start_method

# cycling_llama_dir (tests/conftest.py) cycles 40 41 42 and 50 51 52 53
NGRAM_PROMPTS = [[40, 41, 42, 40], [50, 51], [5, 40, 41], [52, 53, 50, 51, 52]]
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7], [100, 200, 300, 400], [11, 12, 13], [42] * 5]


@pytest.fixture(autouse=True)
def _small_kv_cache(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", stage_start_method())


@pytest.mark.forked
def test_tp2_ngram_equals_tp1_without_speculation(cycling_llama_dir):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=14, logprobs=2)
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    with deadline(240):
        ref, none = run_token_prompts(cycling_llama_dir, NGRAM_PROMPTS, params)
        got, metrics = run_token_prompts(
            cycling_llama_dir, NGRAM_PROMPTS, params, tensor_parallel_size=2,
            speculative_config=ngram,
        )  # fmt: skip
    assert none is None
    assert ref[0][0][:6] == [41, 42, 40, 41, 42, 40] and ref[1][0][:5] == [52, 53, 50, 51, 52]
    assert_runs_close(got, ref, range(len(ref)), 1e-4)
    # the cycles are proposed and accepted (counted on TP rank 0)
    assert metrics["num_spec_steps"] >= 8 and metrics["num_accepted_tokens"] >= 20, metrics


@pytest.mark.forked
def test_tp2_draft_model_equals_tp1(tiny_llama_dir, truncated_llama_dir):
    from vllm import SamplingParams

    params = [SamplingParams(temperature=0, max_tokens=12, logprobs=2) for _ in PROMPTS]
    params[2] = SamplingParams(temperature=0.8, seed=3, max_tokens=12)
    spec = dict(speculative_model=truncated_llama_dir, num_speculative_tokens=3)
    with deadline(240):
        plain, _ = run_token_prompts(tiny_llama_dir, PROMPTS, params)
        tp1, tp1_metrics = run_token_prompts(tiny_llama_dir, PROMPTS, params, **spec)
        tp2, tp2_metrics = run_token_prompts(
            tiny_llama_dir, PROMPTS, params, tensor_parallel_size=2,
            speculative_draft_tensor_parallel_size=2, **spec,
        )  # fmt: skip
    greedy = [0, 1, 3]
    assert [tp1[i][0] for i in greedy] == [plain[i][0] for i in greedy]
    assert_runs_close(
        tp2, tp1, range(len(tp1)), 1e-4
    )  # the seeded row too: same draws on TP rank 0
    assert tp2_metrics == tp1_metrics and tp2_metrics["num_spec_steps"] > 0, tp2_metrics


RANK_FAULT_SCRIPT = """
import asyncio, sys
from vllm.spec_decode.spec_decode_worker import SpecDecodeWorker

real = SpecDecodeWorker.execute_model

def _rank_fault(self, request, *args):
    if self.rank == 1 and any(getattr(md, "request_id", None) == "doomed"
                              for md in request.seq_group_metadata_list):
        raise RuntimeError("injected rank failure 41ab")
    return real(self, request, *args)

SpecDecodeWorker.execute_model = _rank_fault  # forked rank processes inherit it

from vllm import SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.engine.async_llm_engine import AsyncLLMEngine

async def main():
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    args = EngineArgs(model=sys.argv[1], device="cpu", tensor_parallel_size=2,
                      speculative_config=spec)
    engine = AsyncLLMEngine(args, log_requests=False)
    sp = SamplingParams(temperature=0.0, max_tokens=3)
    try:
        async for _ in engine.generate({"prompt_token_ids": [40, 41]}, sp, "doomed"):
            pass
    except Exception as e:
        print("REQUEST FAILED", type(e).__name__, str(e).splitlines()[0])
    await engine.shutdown()

asyncio.run(main())
"""


@pytest.mark.forked
def test_raising_rank_fails_its_step_requests_as_without_speculation(cycling_llama_dir, tmp_path):
    """The async engine (the server's path) at TP = 2 with speculation: a rank that raises
    in a step fails that step's requests with the rank's error (RequestFailedError, HTTP
    500), as the TP path without speculation does. Regression: the step's statistics read
    the spec counters from the failed executor, which raised inside the failure handling;
    the engine loop died and the request got EngineDeadError (HTTP 503) instead."""
    # fork: the ranks inherit the injected fault
    proc = run_engine_script(RANK_FAULT_SCRIPT, cycling_llama_dir, cwd=tmp_path, timeout=240)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("REQUEST FAILED")]
    assert line, proc.stderr[-3000:]
    assert line[0].startswith("REQUEST FAILED RequestFailedError pipeline worker rank 1 "), line
    assert "injected rank failure 41ab" in proc.stderr
