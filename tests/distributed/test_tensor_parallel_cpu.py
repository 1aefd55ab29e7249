"""Tensor parallelism on CPU (gloo, float32, mp and Ray executors) vs one rank.

An all-reduce sums partial products in another order than one matmul, so TP is not
bit-exact: greedy tokens must be equal and every returned logprob within 1e-4 of one
rank's (docs/design.md "Tensor parallelism"). Outputs of random tiny models are only
meaningful when not one repeated token, so each reference completion must hold at least
``MIN_DISTINCT`` distinct ids.

Coverage with seven multi-rank engines (CI time): Qwen2 with fewer ranks than KV heads at
TP = 2; Llama with more ranks than KV heads at TP = 2 x PP = 2, which then also loses a rank;
the Ray executor at TP = 2 with one KV head per rank; Gemma 3's final logit soft-cap at
TP = 2; OLMo 2's norms over all heads at TP = 4; ``--quantization fp8`` at TP = 2;
GLM-4.5's replicated router with split routed and shared experts at TP = 2.
"""

import os
import signal
import time

import pytest

from tests.utils import check_outputs_equal, deadline, stage_start_method, vllm_greedy

# Local Ray clusters: one test at a time under pytest-xdist (.ci/run).
pytestmark = pytest.mark.xdist_group("ray")

PROMPTS = ["Hello world", "The capital of France is", "a b c d e f", "one two three four five"]
MAX_TOKENS = 12
MIN_DISTINCT = 4
LOGPROB_TOL = 1e-4


@pytest.fixture(autouse=True)
def _small_kv_cache(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    # The TP = 1 reference runs torch CPU ops in this process: fork only where that is
    # safe (stage_start_method).
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", stage_start_method())
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def _llm(model, **kw):
    from vllm import LLM

    return LLM(model=model, device="cpu", dtype="float32", **kw)


def _greedy(model, **kw):
    """Greedy outputs with top-5 logprobs of a fresh engine (shut down after)."""
    llm = _llm(model, **kw)
    try:
        return vllm_greedy(llm, PROMPTS, MAX_TOKENS, logprobs=5)
    finally:
        llm.llm_engine.shutdown()


def _check_close(ref, out, name: str) -> None:
    """Equal greedy tokens (distinct-token guard) and logprobs within LOGPROB_TOL."""
    for ids, _, _ in ref:
        assert len(set(ids)) >= MIN_DISTINCT, f"reference collapsed to repeats: {ids}"
    check_outputs_equal(ref, out, "tp1", name, PROMPTS)
    for prompt, (_, _, lp_ref), (_, _, lp_out) in zip(PROMPTS, ref, out, strict=True):
        for pos, (a, b) in enumerate(zip(lp_ref, lp_out, strict=True)):
            for token in set(a) & set(b):
                diff = abs(a[token] - b[token])
                assert diff <= LOGPROB_TOL, (prompt, pos, token, a[token], b[token])
            assert len(set(a) & set(b)) >= 4, (prompt, pos, a, b)  # same top-5, ties aside


@pytest.mark.forked
def test_qwen2_tp2_fewer_ranks_than_kv_heads(tiny_qwen2_kv4_dir):
    """Qwen2 (q/k/v biases, tied embeddings), 8 heads / 4 KV heads: 2 KV heads per rank,
    so each rank's KV block is half of one rank's; every rank allocates the minimum."""
    with deadline(240):
        _tp2_case(tiny_qwen2_kv4_dir, kv_heads=4)


def _tp2_case(model_dir: str, kv_heads: int) -> None:
    ref = _greedy(model_dir)
    llm = _llm(model_dir, tensor_parallel_size=2)
    ex = llm.llm_engine.executor
    try:
        # KV cache per rank: each holds max(1, kv_heads / 2) heads, so a block takes
        # that share of one rank's bytes; every rank allocates the minimum block count.
        block_bytes = ex.collective_rpc("get_cache_block_size_bytes")
        from vllm.worker.cache_engine import cache_block_bytes

        mc = llm.llm_engine.config.model_config
        bs = llm.llm_engine.config.cache_config.block_size
        one_rank = cache_block_bytes(mc, bs, mc.num_layers)
        assert block_bytes == [one_rank * max(1, kv_heads // 2) // kv_heads] * 2
        blocks = ex.collective_rpc("determine_num_available_blocks")
        assert llm.llm_engine.config.cache_config.num_gpu_blocks == min(blocks)
        out = vllm_greedy(llm, PROMPTS, MAX_TOKENS, logprobs=5)
    finally:
        llm.llm_engine.shutdown()
    _check_close(ref, out, "tp2")


@pytest.mark.forked
def test_llama_tp2_pp2_more_ranks_than_kv_heads_then_killed_rank(tiny_llama_hd64_dir):
    """Llama, 2 heads / 1 KV head (replicated on both TP ranks), TP = 2 x PP = 2 (4
    processes; 3 layers split 2 + 1) gives one rank's greedy tokens and logprobs; each
    rank's KV block holds its stage's layers of the one KV head. Then SIGKILL rank 1
    (stage 0, TP rank 1, not the sampling rank): the next step fails within 30 s with an
    error naming rank 1, no hang, and shutdown leaves no worker behind."""
    import psutil

    from vllm import SamplingParams
    from vllm.worker.cache_engine import cache_block_bytes

    model = tiny_llama_hd64_dir
    with deadline(300):
        ref = _greedy(model)
        llm = _llm(model, tensor_parallel_size=2, pipeline_parallel_size=2)
        engine = llm.llm_engine
        try:
            ex = engine.executor
            assert len(ex.worker_pids) == 4
            cfg = engine.config
            layer = cache_block_bytes(cfg.model_config, cfg.cache_config.block_size, 1)
            assert ex.collective_rpc("get_cache_block_size_bytes") == [2 * layer] * 2 + [layer] * 2
            blocks = ex.collective_rpc("determine_num_available_blocks")
            assert blocks[2] > blocks[0] and cfg.cache_config.num_gpu_blocks == min(blocks)
            out = vllm_greedy(llm, PROMPTS, MAX_TOKENS, logprobs=5)
            _check_close(ref, out, "tp2xpp2")
            pids = list(engine.executor.worker_pids)
            os.kill(pids[1], signal.SIGKILL)
            t0 = time.monotonic()
            params = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
            with deadline(30), pytest.raises(RuntimeError, match="rank 1 ") as info:
                llm.generate(PROMPTS, params, use_tqdm=False)
            assert time.monotonic() - t0 < 30
            assert "died" in str(info.value)
        finally:
            engine.shutdown()
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
        assert alive == []


@pytest.mark.forked
def test_ray_tp2_equals_tp1(tiny_llama_dir):
    """TP = 2 on the Ray executor: two actors of one placement group, one's tokens."""
    ray = pytest.importorskip("ray")
    with deadline(240):
        ref = _greedy(tiny_llama_dir)
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 * 1024**2,
                 log_to_driver=False)  # fmt: skip
        try:
            llm = _llm(tiny_llama_dir, tensor_parallel_size=2, distributed_executor_backend="ray")
            try:
                ex = llm.llm_engine.executor
                assert type(ex).__name__ == "RayExecutor" and len(ex.actors) == 2
                out = vllm_greedy(llm, PROMPTS, MAX_TOKENS, logprobs=5)
            finally:
                llm.llm_engine.shutdown()
        finally:
            ray.shutdown()
    _check_close(ref, out, "ray-tp2")


@pytest.mark.forked
def test_gemma3_tp2_final_logit_softcap(tiny_gemma3_dir):
    """Gemma 3 with ``final_logit_softcapping`` at TP = 2 (2 heads / 1 KV head, replicated)
    gives one rank's tokens and logprobs. Guards the soft-cap being applied on TP rank 1,
    whose LM head returns no logits (only TP rank 0 gathers them): that raised a TypeError
    in the worker and killed the engine on its first step."""
    with deadline(240):
        ref = _greedy(tiny_gemma3_dir)
        llm = _llm(tiny_gemma3_dir, tensor_parallel_size=2)
        try:
            assert llm.llm_engine.config.model_config.hf_config.final_logit_softcapping
            out = vllm_greedy(llm, PROMPTS, MAX_TOKENS, logprobs=5)
        finally:
            llm.llm_engine.shutdown()
    _check_close(ref, out, "gemma3-tp2")


@pytest.mark.forked
def test_olmo2_tp4_norms_span_the_ranks(tiny_olmo2_dir):
    """OLMo 2's q/k norms are over all heads: at TP = 4 (4 heads / 2 KV heads) each rank
    holds one query head and a replica of one KV head, normalises with the all-reduced sum
    of squares (the KV replicas counted once) and its slice of the norm weights; tokens and
    logprobs equal one rank's."""
    with deadline(240):
        ref = _greedy(tiny_olmo2_dir)
        out = _greedy(tiny_olmo2_dir, tensor_parallel_size=4)
    _check_close(ref, out, "olmo2-tp4")


@pytest.mark.forked
def test_fp8_tp2_equals_tp1(tiny_llama_dir):
    """``--quantization fp8`` at TP = 2 gives TP = 1's fp8 tokens and logprobs. o_proj and
    down_proj split each weight row over the ranks; every rank scales its half-rows by the
    whole row's maximum (reduced over the TP group), so the ranks hold exactly the slices
    of one rank's quantized weights. Guards per-rank maxima, which quantize each half
    differently from one rank."""
    with deadline(240):
        ref = _greedy(tiny_llama_dir, quantization="fp8")
        out = _greedy(tiny_llama_dir, quantization="fp8", tensor_parallel_size=2)
    _check_close(ref, out, "fp8-tp2")


@pytest.mark.forked
def test_glm4_moe_tp2_equals_tp1(tiny_glm4_moe_dir):
    """GLM-4.5 at TP = 2: the float32 router (weight and correction bias) is replicated, so
    every rank picks the same experts; each rank holds half of every expert's and of the
    shared expert's width, the q/k/v biases and q/k norms of its heads. Tokens and
    logprobs equal one rank's."""
    with deadline(240):
        ref = _greedy(tiny_glm4_moe_dir)
        out = _greedy(tiny_glm4_moe_dir, tensor_parallel_size=2)
    _check_close(ref, out, "glm4-moe-tp2")
