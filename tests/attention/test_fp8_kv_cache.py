"""``--kv-cache-dtype fp8 | fp8_e4m3 | fp8_e5m2`` on CPU (vllm/attention/kv_cache_dtype.py).

The reference is transformers in float32 on the same weights with a cache that stores
every key and value rounded as the engine's 8-bit cache does (clamp to the format's range,
round to it) and hands the rounded values to attention, the step's own included: the
engine's rule. Against it, tokens are exact and logprobs within 1e-4 (docs/design.md: CPU
float32); against transformers without the rounding the logprobs differ by far more, so the
comparison sees the cache's dtype.
"""

import pytest
import torch

from tests.utils import (
    check_outputs_equal,
    check_top5_logprobs_within,
    hf_greedy,
    stage_start_method,
    vllm_greedy,
)
from vllm.attention.kv_cache_dtype import as_stored, store_rows, to_cache

MAX_TOKENS = 24
# long enough that the repeated run reuses whole 16-token blocks (prefix caching)
PROMPTS = [
    "The capital of France is Paris, and the capital of Germany is Berlin; the capital of",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z a b c d e f g h",
    "Hello world",
]


def _rounded_reference(model: str, cache_dtype: torch.dtype, scales=None):
    """transformers greedy (ids, text, top-5 logprobs per position) with a cache that
    rounds keys and values to ``cache_dtype`` before attention reads them; with ``scales``
    (one (k_scale, v_scale) pair of floats per layer) it rounds ``x / scale`` and
    multiplies back, as an 8-bit cache with a checkpoint's KV-cache scales does."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

    class RoundingCache(DynamicCache):
        def update(self, key, value, layer_idx, *args, **kwargs):
            ks, vs = scales[layer_idx] if scales is not None else (1.0, 1.0)
            k, v = as_stored(key, cache_dtype, ks), as_stored(value, cache_dtype, vs)
            return super().update(k, v, layer_idx, *args, **kwargs)

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model)
    out = []
    for prompt in PROMPTS:
        ids = torch.tensor([tok.encode(prompt)])
        with torch.no_grad():
            gen = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=MAX_TOKENS, past_key_values=RoundingCache(),
                              output_scores=True, return_dict_in_generate=True,
                              pad_token_id=tok.eos_token_id)  # fmt: skip
        new = gen.sequences[0, ids.shape[1] :].tolist()
        lps = []
        for scores in gen.scores[: len(new)]:
            vals, idx = torch.log_softmax(scores[0].float(), dim=-1).topk(5)
            lps.append({int(i): float(v) for v, i in zip(vals, idx)})
        out.append((new, tok.decode(new, skip_special_tokens=True).rstrip("\ufffd"), lps))
    return out


def _max_logprob_gap(a, b) -> float:
    """Largest |logprob| difference over the tokens both runs list at each position."""
    gap = 0.0
    for (_, _, la), (_, _, lb) in zip(a, b):
        for pa, pb in zip(la, lb):
            gap = max([gap, *(abs(pa[t] - pb[t]) for t in set(pa) & set(pb))])
    return gap


def check_plain_cached_chunked(llm, model: str, name: str, ref: list, ref_name: str) -> None:
    """``llm`` (an 8-bit cache ``name``, prefix caching on) equals ``ref`` (greedy ids and
    top-5 logprobs within 1e-4): its first run, the same prompts again (their blocks reused:
    at least 2 blocks of hits), and a second engine on ``model`` with 8-token chunked
    prefill (shut down here; ``llm`` is left to the caller)."""
    from vllm import LLM

    first = vllm_greedy(llm, PROMPTS, MAX_TOKENS, logprobs=5)
    check_outputs_equal(ref, first, ref_name, name, PROMPTS)
    check_top5_logprobs_within(ref, first, name)
    manager = llm.llm_engine.schedulers[0].block_manager
    hits = manager.num_hit_tokens
    again = vllm_greedy(llm, PROMPTS, MAX_TOKENS, logprobs=5)
    assert manager.num_hit_tokens >= hits + 16 * 2, (hits, manager.num_hit_tokens)
    check_outputs_equal(ref, again, ref_name, name + "-prefix-cached", PROMPTS)
    check_top5_logprobs_within(ref, again, name + "-prefix-cached")
    chunked = LLM(model=model, device="cpu", dtype="float32", kv_cache_dtype=name,
                  enable_chunked_prefill=True, max_num_batched_tokens=8, max_num_seqs=4,
                  enable_prefix_caching=False)  # fmt: skip
    out = vllm_greedy(chunked, PROMPTS, MAX_TOKENS, logprobs=5)
    check_outputs_equal(ref, out, ref_name, name + "-chunked", PROMPTS)
    check_top5_logprobs_within(ref, out, name + "-chunked")
    chunked.llm_engine.shutdown()


@pytest.mark.forked
@pytest.mark.parametrize(
    "fixture,name,dtype",
    [("tiny_llama_dir", "fp8", torch.float8_e4m3fn),
     ("tiny_qwen2_dir", "fp8_e5m2", torch.float8_e5m2)],
)  # fmt: skip
def test_8bit_cache_equals_transformers_with_the_same_rounding(fixture, name, dtype, request):
    """Plain, prefix-cached (the same prompts again: their blocks are reused) and chunked
    prefill (8-token chunks) all equal the rounding reference; the cache tensors are 8-bit
    and hold four times the blocks of a float32 cache in the same bytes."""
    from vllm import LLM

    model = request.getfixturevalue(fixture)
    ref = _rounded_reference(model, dtype)
    for ids, _, _ in ref:  # distinct-token guard (docs/design.md)
        assert len(set(ids)) >= 4, ids
    unrounded = hf_greedy(model, PROMPTS, MAX_TOKENS)
    assert _max_logprob_gap(ref, unrounded) > 1e-3  # the rounding is visible

    llm = LLM(model=model, device="cpu", dtype="float32", kv_cache_dtype=name)
    worker = llm.llm_engine.executor.worker
    caches = worker.cache_engines[0].kv_caches
    assert {c.dtype for c in caches} == {dtype}
    check_plain_cached_chunked(llm, model, name, ref, "hf-rounded")
    blocks = llm.llm_engine.cache_config.num_gpu_blocks
    llm.llm_engine.shutdown()
    full = LLM(model=model, device="cpu", dtype="float32", enable_prefix_caching=False)
    # the same bytes; each count is the budget's blocks less a scratch block of its own size
    assert abs(blocks - 4 * full.llm_engine.cache_config.num_gpu_blocks) <= 4


def test_rounding_clamps_and_writes_the_bytes():
    """to_cache clamps to the format's finite range before rounding; store_rows writes the
    rounded values (through the 8-bit view on CPU) and leaves other rows alone."""
    x = torch.tensor([[500.0, -1000.0, 0.3, 1e-9]])
    assert to_cache(x, torch.float8_e4m3fn).float().tolist() == [[448.0, -448.0, 0.3125, 0.0]]
    assert to_cache(x, torch.float8_e5m2).float().tolist() == [[512.0, -1024.0, 0.3125, 0.0]]
    assert as_stored(x, torch.float32) is x
    cache = torch.zeros(4, 2, 3, dtype=torch.float8_e4m3fn)  # [rows, kv_heads, D]
    rows = torch.randn(2, 2, 3) * 100
    store_rows(cache, torch.tensor([3, 1]), rows)
    assert torch.equal(cache[3].float(), as_stored(rows[0], torch.float8_e4m3fn))
    assert torch.equal(cache[1].float(), as_stored(rows[1], torch.float8_e4m3fn))
    assert not cache[0].float().any() and not cache[2].float().any()


def test_flashinfer_plans_the_8bit_cache_and_bypasses_the_small_kernel():
    """The FLASHINFER backend plans its wrappers with the cache's dtype, writes the cache
    rounded, and takes no step down the small-decode kernel (which reads the model's dtype);
    its graph prefill attends to the rounded keys and values, as the wrappers read them."""
    from vllm.attention.backends.abstract import AttentionSpec
    from vllm.attention.backends.flashinfer.flashinfer import FlashInferBackend
    from vllm.attention.backends.flashinfer.flashinfer_prefill import (
        GraphPrefillImpl,
        graph_prefill_metadata,
    )
    from vllm.attention.backends.torch_sdpa import causal_prefill

    def spec(kv):
        return AttentionSpec(num_heads=4, num_kv_heads=2, head_size=8, block_size=4,
                             dtype=torch.float32, device=torch.device("cpu"),
                             small_decode_max_rows=4, kv_cache_dtype=kv)  # fmt: skip

    fake = type("Fake", (), {"__init__": lambda self, *a, **k: None})
    plain = FlashInferBackend(spec(None), fake, fake, prebuild=False)
    fp8 = FlashInferBackend(spec(torch.float8_e4m3fn), fake, fake, prebuild=False)
    assert plain.plan_kwargs()["kv_data_type"] == torch.float32 and plain.small_max_rows == 4
    assert fp8.plan_kwargs()["kv_data_type"] == torch.float8_e4m3fn and fp8.small_max_rows == 0

    torch.manual_seed(0)
    n = 5
    q, k, v = (torch.randn(n, h * 8) * 30 for h in (4, 2, 2))
    shape = FlashInferBackend.get_kv_cache_shape(3, 4, 2, 8)
    cache = torch.zeros(shape, dtype=torch.float8_e4m3fn)
    slots = torch.arange(n)
    key_rows = slots + (slots // 4) * 4
    md = graph_prefill_metadata(torch.stack([slots, key_rows, key_rows + 4]), 8)
    layer = type("L", (), dict(num_heads=4, num_kv_heads=2, head_size=8, scale=8**-0.5))
    out = GraphPrefillImpl.forward(layer, q, k, v, cache, md)
    flat = cache.view(-1, 2, 8)
    assert torch.equal(flat[key_rows].float(), as_stored(k.view(n, 2, 8), cache.dtype))
    assert torch.equal(flat[key_rows + 4].float(), as_stored(v.view(n, 2, 8), cache.dtype))
    rk, rv = (as_stored(t.view(n, 2, 8), cache.dtype) for t in (k, v))
    want = causal_prefill(q.view(n, 4, 8), rk, rv, [0, n], layer.scale).reshape(n, -1)
    assert torch.equal(out, want)
    unrounded = causal_prefill(q.view(n, 4, 8), k.view(n, 2, 8), v.view(n, 2, 8), [0, n],
                               layer.scale).reshape(n, -1)  # fmt: skip
    assert not torch.allclose(out, unrounded, atol=1e-3)


@pytest.mark.forked
def test_metrics_cache_config_info_names_the_cache_dtype(tiny_llama_dir):
    """``vllm:cache_config_info`` carries the ``cache_dtype`` label (as upstream's, whose
    labels are every CacheConfig field), so /metrics tells an fp8 cache from the model's."""
    import asyncio

    from vllm.engine.arg_utils import EngineArgs
    from vllm.engine.async_llm_engine import AsyncLLMEngine

    async def render(kv: str) -> str:
        args = EngineArgs(model=tiny_llama_dir, device="cpu", kv_cache_dtype=kv,
                          num_gpu_blocks_override=8, max_model_len=64)  # fmt: skip
        engine = AsyncLLMEngine(args, log_requests=False)
        try:
            return engine.metrics.render().decode()
        finally:
            await engine.shutdown()

    for kv in ("fp8", "auto"):
        info = [ln for ln in asyncio.run(render(kv)).splitlines()
                if ln.startswith("vllm:cache_config_info{")]  # fmt: skip
        assert len(info) == 1 and f'cache_dtype="{kv}"' in info[0], info


def test_checkpoint_kv_scales_are_reported_applied_or_unused(tiny_llama_dir, tmp_path, caplog):
    """A compressed-tensors checkpoint with a ``kv_cache_scheme`` (its k_scale / v_scale
    tensors): before anything starts, one info line naming the model says the scales are
    applied under ``--kv-cache-dtype fp8`` / ``fp8_e5m2`` and unused under ``auto``; a
    checkpoint without the scheme gets no such line."""
    from tests.models.test_fp8_checkpoint import _compressed_tensors_config, _write
    from vllm.engine.arg_utils import EngineArgs

    qc = _compressed_tensors_config("channel", static=False)
    qc["kv_cache_scheme"] = {"num_bits": 8, "type": "float", "strategy": "tensor",
                             "dynamic": False}  # fmt: skip
    fp8_dir = str(tmp_path / "fp8")
    _write(tiny_llama_dir, fp8_dir, str(tmp_path / "deq"), False, qc, kv_scales=True)
    for kv, word in (("fp8", "applied"), ("fp8_e5m2", "applied"), ("auto", "unused")):
        caplog.clear()
        with caplog.at_level("INFO", logger="vllm.engine.arg_utils"):
            EngineArgs(model=fp8_dir, device="cpu", kv_cache_dtype=kv).create_engine_config()
        hits = [r for r in caplog.records if "declares KV-cache scales" in r.getMessage()]
        assert len(hits) == 1 and hits[0].levelname == "INFO", (kv, caplog.text)
        msg = hits[0].getMessage()
        assert fp8_dir in msg and f"are {word}" in msg, msg
        assert f"--kv-cache-dtype {kv}" in msg, msg
    caplog.clear()
    with caplog.at_level("INFO", logger="vllm.engine.arg_utils"):  # no scheme: no line
        EngineArgs(model=tiny_llama_dir, device="cpu", kv_cache_dtype="fp8").create_engine_config()
    assert "KV-cache scales" not in caplog.text


@pytest.mark.forked
def test_8bit_cache_under_pipeline_parallel_multi_step(tiny_llama_dir, monkeypatch):
    """PP = 2 (mp executor, two stages, two virtual engines) with 4 steps per call and an
    e4m3 cache on each stage gives the rounding reference's tokens and logprobs."""
    from vllm import LLM

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.1")
    # the reference runs torch CPU ops in this process (stage_start_method: fork only
    # where that is safe)
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", stage_start_method())
    ref = _rounded_reference(tiny_llama_dir, torch.float8_e4m3fn)
    llm = LLM(model=tiny_llama_dir, device="cpu", dtype="float32", kv_cache_dtype="fp8",
              pipeline_parallel_size=2, num_scheduler_steps=4)  # fmt: skip
    try:
        out = vllm_greedy(llm, PROMPTS, MAX_TOKENS, logprobs=5)
    finally:
        llm.llm_engine.shutdown()
    check_outputs_equal(ref, out, "hf-rounded", "fp8-pp2-steps4", PROMPTS)
    check_top5_logprobs_within(ref, out, "fp8-pp2-steps4")
