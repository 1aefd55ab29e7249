"""The engine's adapter calls (upstream's ``add_lora``, ``remove_lora``, ``list_loras``,
``pin_lora``) on CPU float32: an added adapter is read on every worker before any request;
a pinned one outlives ``max_cpu_loras``; a removed id is forgotten everywhere, so the same
id may then name another adapter, whose outputs equal PEFT's (not the stale one's)."""

import pytest

from tests.lora.conftest import peft_greedy
from tests.utils import run_in_fork

PROMPT = [1, 5, 9, 22, 40, 7, 3, 100, 12]
N = 6


def test_add_pin_remove_list(tiny_llama_dir, lora_adapters):
    def run():
        from vllm import LLM, SamplingParams
        from vllm.lora.request import LoRARequest

        llm = LLM(model=tiny_llama_dir, device="cpu", dtype="float32", enable_lora=True,
                  max_loras=1, max_cpu_loras=1, max_lora_rank=8)  # fmt: skip
        eng = llm.llm_engine
        host = eng.executor.worker.model_runner.lora.host  # the worker's host cache
        sp = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True)

        carried = []

        def ids(lora):
            out = llm.generate([{"prompt_token_ids": PROMPT}], sp, lora_request=lora)
            carried.append(out[0].lora_request == lora == out[0].outputs[0].lora_request)
            return list(out[0].outputs[0].token_ids)

        seen = {"start": (sorted(eng.list_loras()), list(host))}
        assert eng.add_lora(LoRARequest("a", 1, lora_adapters["all"])) is True
        seen["added"] = (sorted(eng.list_loras()), list(host))
        assert eng.pin_lora(1) is True
        eng.add_lora(LoRARequest("b", 2, lora_adapters["qv"]))  # max_cpu_loras=1: 1 pinned
        seen["pinned"] = (sorted(eng.list_loras()), sorted(host))
        got_all = ids(LoRARequest("a", 1, lora_adapters["all"]))
        assert eng.remove_lora(1) is True and eng.remove_lora(1) is False
        seen["removed"] = (sorted(eng.list_loras()), sorted(host))
        got_reused = ids(LoRARequest("c", 1, lora_adapters["qv"]))  # id 1, another adapter
        errors = []
        for call in (lambda: eng.pin_lora(99), lambda: eng.add_lora(None)):
            try:
                call()
            except ValueError as e:
                errors.append(str(e))
        ids(None)  # the base model: lora_request None on both outputs
        return seen, got_all, got_reused, errors, carried

    seen, got_all, got_reused, errors, carried = run_in_fork(run)
    assert carried == [True, True, True]  # RequestOutput / CompletionOutput.lora_request
    assert seen["start"] == [[], []]
    assert seen["added"] == [[1], [1]]  # read before any request used it
    assert seen["pinned"] == [[1, 2], [1, 2]]  # the pin kept 1 beyond max_cpu_loras
    # using pinned 1 dropped unpinned 2 from the host (one slot of max_cpu_loras) but not
    # from the engine, which would read it again
    assert seen["removed"] == [[2], []]
    assert got_all == peft_greedy(tiny_llama_dir, lora_adapters["all"], PROMPT, N)[0]
    want_qv = peft_greedy(tiny_llama_dir, lora_adapters["qv"], PROMPT, N)[0]
    assert got_reused == want_qv != got_all
    assert "LoRA adapter 99 is not known" in errors[0] and "known: [1, 2]" in errors[0]
    assert "add_lora needs a LoRARequest" in errors[1]


def test_calls_without_lora(tiny_llama_dir):
    def run():
        from vllm import LLM
        from vllm.lora.request import LoRARequest

        eng = LLM(model=tiny_llama_dir, device="cpu", dtype="float32").llm_engine
        try:
            eng.add_lora(LoRARequest("a", 1, "/nowhere"))
        except ValueError as e:
            return sorted(eng.list_loras()), eng.remove_lora(1), str(e)

    loras, removed, error = run_in_fork(run)
    assert loras == [] and removed is False
    assert "runs without LoRA" in error


@pytest.mark.parametrize("executor", ["mp"])
def test_calls_reach_every_stage(tiny_llama_dir, lora_adapters, executor):
    def run():
        from vllm import LLM, SamplingParams
        from vllm.lora.request import LoRARequest

        llm = LLM(model=tiny_llama_dir, device="cpu", dtype="float32", enable_lora=True,
                  max_lora_rank=8, pipeline_parallel_size=2,
                  distributed_executor_backend=executor)  # fmt: skip
        eng = llm.llm_engine
        sp = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True)
        eng.add_lora(LoRARequest("a", 1, lora_adapters["all"]))
        eng.pin_lora(1)
        eng.remove_lora(1)
        out = llm.generate([{"prompt_token_ids": PROMPT}], sp,
                           lora_request=LoRARequest("c", 1, lora_adapters["qv"]))  # fmt: skip
        llm.llm_engine.shutdown()
        return list(out[0].outputs[0].token_ids)

    assert run_in_fork(run) == peft_greedy(tiny_llama_dir, lora_adapters["qv"], PROMPT, N)[0]


@pytest.mark.forked
def test_add_request_takes_lora_request_fifth_as_upstream(tiny_llama_dir, lora_adapters):
    """``LLMEngine.add_request(request_id, prompt, params, arrival_time, lora_request)``, in
    upstream's order (V0 and V1): an adapter passed fifth runs the request with it, and the
    output equals the keyword call's. Guards: the fifth parameter was ``priority``, so the
    adapter was refused as "priority must be an integer"."""
    import time

    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    llm = LLM(model=tiny_llama_dir, device="cpu", enable_lora=True, max_lora_rank=8)
    eng = llm.llm_engine
    sp = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True)
    lora = LoRARequest("qv", 1, lora_adapters["qv"])
    eng.add_request("pos", {"prompt_token_ids": PROMPT}, sp, time.time(), lora)
    eng.add_request("kw", {"prompt_token_ids": PROMPT}, sp, lora_request=lora, priority=0)
    eng.add_request("base", {"prompt_token_ids": PROMPT}, sp)
    done = {}
    while eng.has_unfinished_requests():
        done.update({o.request_id: o for o in eng.step() if o.finished})
    assert done["pos"].lora_request == lora
    assert done["pos"].outputs[0].token_ids == done["kw"].outputs[0].token_ids
    assert done["pos"].outputs[0].token_ids != done["base"].outputs[0].token_ids


def test_removed_id_reused_with_prefix_caching(tiny_llama_dir, lora_adapters):
    """With prefix caching, an id removed (``remove_lora``) and then given to another
    adapter never finds the blocks computed with the old adapter: the new adapter's outputs
    equal PEFT's, and the prompt is computed again. Guards: blocks were keyed by the id
    alone, so the second request reused the first adapter's KV and its greedy ids were
    neither adapter's."""

    def run():
        from vllm import LLM, SamplingParams
        from vllm.lora.request import LoRARequest

        llm = LLM(model=tiny_llama_dir, device="cpu", dtype="float32", enable_lora=True,
                  max_lora_rank=8, block_size=4, enable_prefix_caching=True)  # fmt: skip
        sp = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True)

        def gen(lora):
            (out,) = llm.generate([{"prompt_token_ids": PROMPT}], sp, lora_request=lora)
            return list(out.outputs[0].token_ids), out.num_cached_tokens

        first = gen(LoRARequest("a", 1, lora_adapters["all"]))
        again = gen(LoRARequest("a", 1, lora_adapters["all"]))
        llm.llm_engine.remove_lora(1)
        reused = gen(LoRARequest("b", 1, lora_adapters["qv"]))
        return first, again, reused

    first, again, reused = run_in_fork(run)
    want_all = peft_greedy(tiny_llama_dir, lora_adapters["all"], PROMPT, N)[0]
    want_qv = peft_greedy(tiny_llama_dir, lora_adapters["qv"], PROMPT, N)[0]
    assert first == [want_all, 0]
    assert again == [want_all, 8]  # 9 prompt tokens: 2 full blocks before the last
    assert reused == [want_qv, 0], f"{reused} != {[want_qv, 0]} (all: {want_all})"
