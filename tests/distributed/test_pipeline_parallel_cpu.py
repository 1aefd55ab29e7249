"""Pipeline parallelism on CPU (gloo, mp executor, float32): exact vs PP=1.

docs/design.md: anything on CPU in float32 is compared exactly, PP vs not included. With P
stages there are P virtual engines, so requests are split across schedulers and batch
compositions differ from PP=1; float32 CPU arithmetic is still row-independent, so greedy
outputs must be identical.
"""

import time

import pytest

from tests.utils import check_outputs_equal, deadline, stage_start_method, vllm_greedy

SMOLLM2_PROMPTS = [
    "The capital of France is",
    "Hello, my name is",
    "def fibonacci(n):",
    "Once upon a time,",
]
TINY_PROMPTS = [
    "Hello world",
    "The capital of France is",
    "a b c d e f",
    "Paris",
    "one two three four five six seven",
    "x",
]


def _llm(model, **kw):
    from vllm import LLM

    return LLM(model=model, device="cpu", dtype="float32", **kw)


def _run(model, prompt_sets, max_tokens, **kw):
    """Greedy outputs for each prompt list, plus the engine's max steps in flight."""
    llm = _llm(model, **kw)
    try:
        outs = [vllm_greedy(llm, prompts, max_tokens) for prompts in prompt_sets]
        return outs, getattr(llm.llm_engine, "max_steps_in_flight", 0)
    finally:
        llm.llm_engine.shutdown()


@pytest.fixture(autouse=True)
def _small_kv_cache(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.1")
    # These tests run torch CPU ops (tiny-model fixtures, PP = 1 references) in the process
    # that starts the workers: fork only where that is safe (stage_start_method).
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", stage_start_method())


@pytest.mark.forked
def test_smollm2_pp2_pp3_equal_pp1(smollm2_gguf):
    """SmolLM2 (30 layers) split 15/15 and 10/10/10 gives PP=1's greedy tokens exactly;
    embedding on stage 0, final norm and the tied lm_head on the last stage."""
    with deadline(240):
        (ref,), _ = _run(smollm2_gguf, [SMOLLM2_PROMPTS], 16, max_model_len=512)
        assert ref[0][1].startswith(" Paris"), ref[0][1]
        for pp in (2, 3):
            t0 = time.perf_counter()
            (out,), in_flight = _run(smollm2_gguf, [SMOLLM2_PROMPTS], 16, max_model_len=512,
                                     pipeline_parallel_size=pp)  # fmt: skip
            print(f"PP={pp}: {time.perf_counter() - t0:.1f} s, max in flight {in_flight}")
            check_outputs_equal(ref, out, "pp1", f"pp{pp}", SMOLLM2_PROMPTS)
            # 4 prompts over pp virtual engines: every VE has work, the pipeline fills.
            assert in_flight == pp


@pytest.mark.forked
def test_tiny_odd_layers_pp2_concurrency(tiny_llama_dir):
    """3 layers on 2 stages (2 + 1): 1, 2, 3, 5 and 16 concurrent requests all finish in
    time with PP=1's tokens; under load two steps (one per VE) are in flight."""
    sets = [[TINY_PROMPTS[i % len(TINY_PROMPTS)] for i in range(n)] for n in (1, 2, 3, 5, 16)]
    with deadline(120):
        ref, in_flight1 = _run(tiny_llama_dir, sets, 24)
        assert in_flight1 == 0  # the uniproc path does not pipeline
        out, in_flight = _run(tiny_llama_dir, sets, 24, pipeline_parallel_size=2)
    for prompts, r, o in zip(sets, ref, out):
        assert len(o) == len(prompts)
        assert all(len(ids) == 24 for ids, _, _ in o), "a request did not complete"
        assert all(len(set(ids)) >= 4 for ids, _, _ in r), "degenerate tiny-model output"
        check_outputs_equal(r, o, "pp1", "pp2", prompts)
    assert in_flight == 2


@pytest.mark.forked
def test_layer_partition_env_override(tiny_llama_dir, monkeypatch):
    """VLLM_PP_LAYER_PARTITION="1,2" reaches the spawned workers and stays exact."""
    with deadline(90):
        ref, _ = _run(tiny_llama_dir, [TINY_PROMPTS[:3]], 12)
        monkeypatch.setenv("VLLM_PP_LAYER_PARTITION", "1,2")
        llm = _llm(tiny_llama_dir, pipeline_parallel_size=2)
        try:
            out = vllm_greedy(llm, TINY_PROMPTS[:3], 12)
            layers = llm.llm_engine.executor.collective_rpc("get_cache_block_size_bytes")
        finally:
            llm.llm_engine.shutdown()
    check_outputs_equal(ref[0], out, "pp1", "pp2-1,2", TINY_PROMPTS[:3])
    assert layers[1] == 2 * layers[0]  # stage 1 caches two layers, stage 0 one


@pytest.mark.forked
def test_abort_while_the_step_runs_gives_no_output(tiny_llama_dir):
    """PP = 2 keeps a step in flight while the engine returns; a request aborted then
    gets no output afterwards (as at PP = 1), and the others finish as usual."""
    from vllm import EngineArgs, LLMEngine, SamplingParams

    args = EngineArgs(model=tiny_llama_dir, device="cpu", dtype="float32",
                      pipeline_parallel_size=2)  # fmt: skip
    engine = LLMEngine.from_engine_args(args)
    try:
        with deadline(120):
            params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
            for rid, prompt in zip("abcd", TINY_PROMPTS):
                engine.add_request(rid, prompt, params)
            for _ in range(4):
                engine.step()
            assert engine.max_steps_in_flight == 2
            engine.abort_request("c")
            after, finished = [], {}
            while engine.has_unfinished_requests():
                for out in engine.step():
                    after.append(out.request_id)
                    if out.finished:
                        finished[out.request_id] = out
    finally:
        engine.shutdown()
    assert "c" not in after
    assert sorted(finished) == ["a", "b", "d"]
    assert all(len(o.outputs[0].token_ids) == 12 for o in finished.values())
