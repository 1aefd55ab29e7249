"""LoRA adapters end to end on CPU float32: the engine's outputs with PEFT adapters equal
PEFT's own (greedy ids exact; logprobs within 1e-4: the engine folds the scale into B and
sums the adapters' terms in another order, which changes float32 rounding only), for
batches mixing adapters and the base model, with one adapter slot, with prefix caching
(keyed by adapter), multi-step decoding, chunked prefill and PP = 2."""

import gc
import math

import pytest

from tests.lora.conftest import adapter_path, peft_greedy
from tests.utils import stage_start_method

# One xdist worker runs this module (.ci/run: --dist loadgroup), so its module-scoped
# PEFT references are computed once, not once per worker.
pytestmark = pytest.mark.xdist_group("test_lora_engine")

N = 8
PROMPTS = [
    [1, 5, 9, 22, 40, 7, 3, 100, 12, 14, 77, 31],
    [1, 300, 41, 17, 8],
    [1, 64, 65, 66, 67, 68, 69, 70, 71, 90],
]
# (prompt index, adapter name or None): the same prompt under every adapter, and others
CASES = [(0, None), (0, "all"), (0, "qv"), (1, "all"), (2, "qv"), (2, None)]


@pytest.fixture(scope="module")
def refs(tiny_llama_dir, lora_adapters):
    """PEFT's greedy ids and logprobs for every case."""
    return {
        case: peft_greedy(tiny_llama_dir, adapter_path(lora_adapters, case[1]), PROMPTS[case[0]], N)
        for case in CASES
    }


def _llm(model, **kw):
    from vllm import LLM

    kw.setdefault("max_lora_rank", 8)
    return LLM(model=model, device="cpu", dtype="float32", enable_lora=True, **kw)


def _lora(adapters, name):
    from vllm.lora.request import LoRARequest

    if name is None:
        return None
    ids = {"all": 1, "qv": 2}
    return LoRARequest(name, ids[name], adapters[name])


def _generate(llm, adapters, cases):
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=N, temperature=0.0, logprobs=1, ignore_eos=True)
    outs = llm.generate(
        [{"prompt_token_ids": PROMPTS[p]} for p, _ in cases],
        sp,
        lora_request=[_lora(adapters, name) for _, name in cases],
        use_tqdm=False,
    )
    return outs


def _check(outs, cases, refs):
    for out, case in zip(outs, cases):
        ref_ids, ref_lps = refs[case]
        got = out.outputs[0]
        assert list(got.token_ids) == ref_ids, f"{case}: {list(got.token_ids)} != {ref_ids}"
        assert len(set(ref_ids)) >= 3, f"{case}: too few distinct ids to prove anything"
        for pos, (tok, lp) in enumerate(zip(got.token_ids, ref_lps)):
            mine = got.logprobs[pos][tok].logprob
            assert math.isclose(mine, lp, abs_tol=1e-4), f"{case} pos {pos}: {mine} vs {lp}"


def _close(llm):
    llm.llm_engine.shutdown()
    del llm
    gc.collect()


@pytest.mark.forked
def test_mixed_batch_equals_peft(tiny_llama_dir, lora_adapters, refs):
    # the adapters change the outputs, or equality would prove nothing
    assert refs[(0, "all")][0] != refs[(0, None)][0] != refs[(0, "qv")][0]
    llm = _llm(tiny_llama_dir, max_loras=2)
    _check(_generate(llm, lora_adapters, CASES), CASES, refs)
    # the other order: slots are reused, the adapters swap places
    rev = CASES[::-1]
    _check(_generate(llm, lora_adapters, rev), rev, refs)
    _close(llm)


@pytest.mark.forked
def test_one_slot_serves_two_adapters_in_turn(tiny_llama_dir, lora_adapters, refs):
    """max_loras=1: the scheduler never runs both adapters at once; every output still
    equals PEFT's."""
    llm = _llm(tiny_llama_dir, max_loras=1)
    sched = llm.llm_engine.schedulers[0]
    seen = []
    original = sched.schedule

    def schedule():
        md, out = original()
        seen.append({g.lora_int_id for g in out.scheduled_seq_groups if g.lora_int_id})
        return md, out

    sched.schedule = schedule
    _check(_generate(llm, lora_adapters, CASES), CASES, refs)
    assert max(len(s) for s in seen) == 1
    assert {1, 2} <= set().union(*seen)
    _close(llm)


@pytest.mark.forked
def test_prefix_cache_is_keyed_by_adapter(tiny_llama_dir, lora_adapters, refs):
    """A prompt's blocks computed with one adapter are reused by that adapter only."""
    llm = _llm(tiny_llama_dir, max_loras=2, block_size=4, enable_prefix_caching=True)
    got = {}
    for case in [(0, "all"), (0, "qv"), (0, None), (0, "all"), (0, "qv")]:
        (out,) = _generate(llm, lora_adapters, [case])
        _check([out], [case], refs)
        got.setdefault(case, []).append(out.num_cached_tokens)
    # 12 prompt tokens: the 2 full blocks before the last token are cached on a hit
    assert got == {(0, "all"): [0, 8], (0, "qv"): [0, 8], (0, None): [0]}
    _close(llm)


@pytest.mark.forked
@pytest.mark.parametrize(
    "kw",
    [
        dict(num_scheduler_steps=4),
        dict(
            enable_chunked_prefill=True, max_num_batched_tokens=8, max_num_seqs=8, max_model_len=64
        ),
    ],
    ids=["multi_step", "chunked_prefill"],
)
def test_multi_step_and_chunked_prefill(tiny_llama_dir, lora_adapters, refs, kw):
    llm = _llm(tiny_llama_dir, max_loras=2, **kw)
    _check(_generate(llm, lora_adapters, CASES), CASES, refs)
    _close(llm)


@pytest.mark.forked
def test_pipeline_parallel_two_stages(tiny_llama_dir, lora_adapters, refs, monkeypatch):
    """PP = 2 on the mp executor: each stage holds its layers' slots, per virtual engine
    (two VEs, each with its own mix of adapters)."""
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.1")
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", stage_start_method())
    llm = _llm(tiny_llama_dir, max_loras=2, pipeline_parallel_size=2,
               distributed_executor_backend="mp", max_model_len=256)  # fmt: skip
    _check(_generate(llm, lora_adapters, CASES), CASES, refs)
    _close(llm)


@pytest.mark.forked
def test_refused_adapters_leave_the_engine_serving(tiny_llama_dir, lora_adapters, refs):
    from vllm import LLM
    from vllm.lora.request import LoRARequest

    plain = LLM(model=tiny_llama_dir, device="cpu", dtype="float32")
    with pytest.raises(ValueError, match="runs without LoRA; start it with enable_lora=True"):
        _generate(plain, lora_adapters, [(0, "all")])
    _close(plain)

    llm = _llm(tiny_llama_dir, max_loras=1, max_lora_rank=4)
    with pytest.raises(ValueError, match=r"rank r=8, above max_lora_rank=4.*--max-lora-rank 8"):
        _generate(llm, lora_adapters, [(0, None), (0, "all")])  # nothing of it is queued
    missing = LoRARequest("gone", 3, lora_adapters["all"] + "-missing")
    with pytest.raises(ValueError, match="is not a directory"):
        llm.generate([PROMPTS[0]], lora_request=missing, use_tqdm=False)
    other = LoRARequest("qv-again", 2, lora_adapters["all"])
    _generate(llm, lora_adapters, [(2, "qv")])  # id 2 is now the "qv" directory
    with pytest.raises(ValueError, match="lora_int_id=2 already names adapter 'qv'"):
        llm.generate([PROMPTS[0]], lora_request=other, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    _check(_generate(llm, lora_adapters, [(2, "qv"), (0, None)]), [(2, "qv"), (0, None)], refs)
    _close(llm)


# family fixture -> the PEFT target modules of its adapter (MoE: attention only)
FAMILIES = {
    "tiny_qwen3_dir": [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ],  # fmt: skip
    "tiny_gemma3_dir": ["q_proj", "v_proj", "o_proj", "down_proj"],
    "tiny_phi3_dir": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],  # fused names
    "tiny_mixtral_dir": ["q_proj", "k_proj", "v_proj", "o_proj"],
}


@pytest.mark.forked
@pytest.mark.parametrize("family", list(FAMILIES))
def test_families_equal_peft(family, request, tiny_models_dir):
    """Every family's adapters (Phi-3's on its fused projections) equal PEFT's outputs,
    batched with the base model."""
    from tests.conftest import _built
    from tests.lora.conftest import _save_adapter
    from vllm.lora.request import LoRARequest

    base = request.getfixturevalue(family)
    path = _built(tiny_models_dir / f"lora_{family}",
                  lambda p: _save_adapter(base, p, 8, 16, False, FAMILIES[family], 3))  # fmt: skip
    prompt = PROMPTS[0]
    ref_lora = peft_greedy(base, path, prompt, N)
    ref_base = peft_greedy(base, None, prompt, N)
    assert ref_lora[0] != ref_base[0]
    llm = _llm(base, max_model_len=128)
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=N, temperature=0.0, logprobs=1, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": prompt}] * 2, sp, use_tqdm=False,
                        lora_request=[LoRARequest("a", 1, path), None])  # fmt: skip
    refs = {(0, "a"): ref_lora, (0, None): ref_base}
    _check(outs, [(0, "a"), (0, None)], refs)
    _close(llm)


@pytest.mark.forked
def test_throughput_benchmark_cycles_adapters(tiny_llama_dir, lora_adapters):
    """benchmark_throughput --lora-path with three adapter ids over two slots: every
    request completes with its tokens, and the JSON line names the adapters."""
    import importlib
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    tp = importlib.import_module("benchmark_throughput")
    (rec,) = tp.main(["--model", tiny_llama_dir, "--device", "cpu", "--num-prompts", "6",
                      "--input-len", "8", "--output-len", "4", "--enable-lora", "--max-loras",
                      "2", "--max-lora-rank", "8", "--lora-path", lora_adapters["all"],
                      "--num-loras", "3", "--no-tqdm", "--max-model-len", "64"])  # fmt: skip
    assert (rec["num_loras"], rec["output_tokens"]) == (3, 24)
    with pytest.raises(ValueError, match="--lora-path needs --enable-lora"):
        tp.main(["--model", tiny_llama_dir, "--lora-path", lora_adapters["all"]])


@pytest.mark.forked
@pytest.mark.parametrize("family", ["tiny_llama_dir", "tiny_llama_hd64_dir"])
def test_tensor_parallel_two_ranks(family, request, tiny_models_dir, monkeypatch):
    """TP = 2 (mp, gloo): each rank holds its cut of the adapters (B's rows on q/k/v and
    gate/up, A's columns on o/down, summed by the all-reduce); greedy ids equal PEFT's and
    logprobs within 1e-4 (an all-reduce sums in another order). The hd64 model has one KV
    head, so both ranks hold it (replicated k / v rows)."""
    from tests.conftest import _built
    from tests.lora.conftest import ADAPTERS, _save_adapter
    from vllm.lora.request import LoRARequest

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", stage_start_method())
    base = request.getfixturevalue(family)
    path = _built(tiny_models_dir / f"lora_tp_{family}",
                  lambda p: _save_adapter(base, p, *ADAPTERS["all"]))  # fmt: skip
    refs = {(i, "a"): peft_greedy(base, path, PROMPTS[i], N) for i in range(2)}
    refs[(2, None)] = peft_greedy(base, None, PROMPTS[2], N)
    llm = _llm(base, max_loras=1, tensor_parallel_size=2, distributed_executor_backend="mp",
               max_model_len=64)  # fmt: skip
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=N, temperature=0.0, logprobs=1, ignore_eos=True)
    lora = LoRARequest("a", 1, path)
    outs = llm.generate([{"prompt_token_ids": PROMPTS[i]} for i in range(3)], sp,
                        lora_request=[lora, lora, None], use_tqdm=False)  # fmt: skip
    _check(outs, [(0, "a"), (1, "a"), (2, None)], refs)
    _close(llm)


@pytest.mark.forked
def test_beam_search_runs_each_prompt_with_its_adapter(tiny_llama_dir, lora_adapters):
    """LLM.beam_search(prompts, params, lora_request) (upstream's argument order): every
    beam of a prompt runs with that prompt's adapter, so the beams equal a full-vocabulary
    beam search over the PEFT model (and the base model for a prompt without one)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from tests.entrypoints.test_llm_beam_search import _hf_beam_search
    from vllm.sampling_params import BeamSearchParams

    def hf(adapter):
        model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
        if adapter is not None:
            model = PeftModel.from_pretrained(model, lora_adapters[adapter])
        return model.eval()

    cases = [(0, "all"), (1, None), (2, "qv")]
    llm = _llm(tiny_llama_dir, max_loras=2, max_model_len=64)
    params = BeamSearchParams(beam_width=2, max_tokens=3, ignore_eos=True)
    outs = llm.beam_search([{"prompt_token_ids": PROMPTS[p]} for p, _ in cases], params,
                           [_lora(lora_adapters, name) for _, name in cases])  # fmt: skip
    for (p, name), out in zip(cases, outs):
        ref = _hf_beam_search(hf(name), PROMPTS[p], 2, 3)
        assert [s.tokens for s in out.sequences] == [t for t, _ in ref], (p, name)
        for seq, (_, cum) in zip(out.sequences, ref):
            assert seq.cum_logprob == pytest.approx(cum, abs=2e-4)
    # one request for every prompt; the base model's beams differ from the adapter's
    one = llm.beam_search({"prompt_token_ids": PROMPTS[0]}, params, _lora(lora_adapters, "all"))
    assert one[0].sequences[0].tokens == outs[0].sequences[0].tokens
    base = llm.beam_search({"prompt_token_ids": PROMPTS[0]}, params)
    assert base[0].sequences[0].tokens != one[0].sequences[0].tokens
    _close(llm)
