"""``LLM.collective_rpc`` and ``LLM.apply_model`` (upstream's calls on every worker), on CPU
float32: the model they reach holds the checkpoint's weights; a weight changed in place
changes the next generate call exactly as the change predicts (a negated lm_head picks the
least likely token of the unchanged model), and restoring it restores the outputs; under
PP = 2 on the mp executor each stage answers with its own layer range, a call that cannot
be pickled is one TypeError, and the engine keeps serving after it."""

import time

import pytest
import torch
from safetensors.torch import load_file

from tests.utils import run_in_fork, stage_start_method

PROMPT = [1, 5, 9, 22, 40, 7, 3, 100, 12]


def stage_layers(worker, *, with_head: bool) -> list:
    """[start_layer, end_layer] of this rank's model (+ whether it holds an lm_head)."""
    m = worker.model_runner.model
    out = [m.model.start_layer, m.model.end_layer]
    return out + [m.lm_head is not None] if with_head else out


def fail_on_rank(worker, rank: int) -> int:
    """Raise on pipeline rank ``rank``; elsewhere return the rank."""
    if worker.rank == rank:
        raise ValueError(f"refused on rank {rank}")
    return worker.rank


def nap(worker, seconds: float) -> int:
    time.sleep(seconds)
    return worker.rank


def negate_lm_head(model) -> None:
    model.lm_head.weight.mul_(-1.0)


def test_apply_model_reads_and_updates_weights_in_place(tiny_llama_dir):
    def run():
        from vllm import LLM, SamplingParams

        llm = LLM(model=tiny_llama_dir, device="cpu", dtype="float32", max_model_len=128,
                  max_logprobs=-1)  # fmt: skip
        sp = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
        full = SamplingParams(max_tokens=1, temperature=0.0, logprobs=-1)
        want = load_file(f"{tiny_llama_dir}/model.safetensors")
        embed, head = llm.apply_model(
            lambda m: (m.model.embed_tokens.weight.clone(), m.lm_head.weight.clone())
        )[0]
        before = llm.generate([{"prompt_token_ids": PROMPT}], sp, use_tqdm=False)[0].outputs[0]
        out = llm.generate([{"prompt_token_ids": PROMPT}], full, use_tqdm=False)[0].outputs[0]
        first = out.logprobs[0]  # the whole vocabulary at the first step
        assert len(first) == 49152
        least = min(first, key=lambda t: first[t].logprob)
        assert llm.apply_model(negate_lm_head) == [None]
        flipped = llm.generate([{"prompt_token_ids": PROMPT}], sp, use_tqdm=False)[0]
        llm.apply_model(negate_lm_head)
        again = llm.generate([{"prompt_token_ids": PROMPT}], sp, use_tqdm=False)[0].outputs[0]
        summary = llm.collective_rpc("startup_summary")
        return {
            "embed_equal": torch.equal(embed, want["model.embed_tokens.weight"]),
            "head_equal": torch.equal(head, want["lm_head.weight"]),
            "least": least,
            "flipped_first": flipped.outputs[0].token_ids[0],
            "before": list(before.token_ids),
            "again": list(again.token_ids),
            "summaries": [sorted(s) == sorted(summary[0]) for s in summary],
            "n_ranks": len(summary),
        }

    got = run_in_fork(run)
    assert got["embed_equal"] and got["head_equal"]
    assert got["flipped_first"] == got["least"]  # argmax of -logits = argmin of logits
    assert got["flipped_first"] != got["before"][0]
    assert got["again"] == got["before"]  # negated twice: bit-identical weights again
    assert got["n_ranks"] == 1 and got["summaries"] == [True]


def test_collective_rpc_bad_arguments(tiny_llama_dir):
    def run():
        from vllm import LLM

        llm = LLM(model=tiny_llama_dir, device="cpu", dtype="float32", max_model_len=128)
        errors = []
        for call in (
            lambda: llm.collective_rpc("no_such_method"),
            lambda: llm.collective_rpc("startup_summary", args=5),
            lambda: llm.collective_rpc("startup_summary", kwargs=[1]),
        ):
            try:
                call()
                errors.append(None)
            except (AttributeError, TypeError) as e:
                errors.append([type(e).__name__, str(e)])
        kw = llm.collective_rpc(stage_layers, kwargs={"with_head": True})
        return {"errors": errors, "kw": kw}

    got = run_in_fork(run)
    (a_type, a_msg), (b_type, b_msg), (c_type, c_msg) = got["errors"]
    assert a_type == "AttributeError" and "no_such_method" in a_msg
    assert b_type == "TypeError" and "args must be a tuple, got int" in b_msg
    assert c_type == "TypeError" and "kwargs must be a dict, got list" in c_msg
    assert got["kw"] == [[0, 3, True]]


@pytest.mark.forked
def test_pipeline_stages_answer_by_rank(tiny_llama_dir, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", stage_start_method())
    from vllm import LLM, SamplingParams
    from vllm.distributed.utils import get_pp_indices

    llm = LLM(model=tiny_llama_dir, device="cpu", dtype="float32", max_model_len=128,
              pipeline_parallel_size=2)  # fmt: skip
    try:
        sp = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        before = llm.generate([{"prompt_token_ids": PROMPT}], sp, use_tqdm=False)
        got = llm.collective_rpc(stage_layers, kwargs={"with_head": True})
        want = [[*get_pp_indices(3, r, 2), r == 1] for r in range(2)]
        assert got == want and got[0][1] == got[1][0]  # contiguous, the head on the last
        with pytest.raises(TypeError, match="module-level function"):
            llm.apply_model(lambda m: m.model.start_layer)
        # nothing was sent: the next call and generate run as before
        assert llm.collective_rpc(stage_layers, kwargs={"with_head": False}) == [
            w[:2] for w in want
        ]
        # a failing call fails alone, naming the rank and the remote error
        with pytest.raises(RuntimeError, match=r"rank 1 failed in 'rpc'(.|\n)*refused on rank 1"):
            llm.collective_rpc(fail_on_rank, args=(1,))
        with pytest.raises(RuntimeError, match=r"rank 0 (.|\n)*has no attribute 'no_such'"):
            llm.collective_rpc("no_such")
        with pytest.raises(TimeoutError, match=r"did not finish 'rpc' within 0.2 s"):
            llm.collective_rpc(nap, timeout=0.2, args=(1.0,))
        assert llm.collective_rpc(fail_on_rank, args=(5,)) == [0, 1]  # not the late naps
        after = llm.generate([{"prompt_token_ids": PROMPT}], sp, use_tqdm=False)
        assert after[0].outputs[0].token_ids == before[0].outputs[0].token_ids
    finally:
        llm.llm_engine.executor.shutdown()


@pytest.mark.forked
def test_async_engine_call_between_steps(tiny_llama_dir):
    """AsyncLLMEngine.collective_rpc while a request streams: the call answers, and the
    stream's tokens equal those of the same request run alone."""
    import asyncio

    from vllm import SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.engine.async_llm_engine import AsyncLLMEngine

    sp = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)

    async def main():
        engine = AsyncLLMEngine(EngineArgs(model=tiny_llama_dir, device="cpu", max_model_len=128))
        try:

            async def final(rid):
                outs = [o async for o in engine.generate({"prompt_token_ids": PROMPT}, sp, rid)]
                return list(outs[-1].outputs[0].token_ids)

            alone = await final("alone")
            task = asyncio.ensure_future(final("beside"))
            await asyncio.sleep(0)
            layers = await engine.collective_rpc(stage_layers, kwargs={"with_head": True})
            return alone, await task, layers
        finally:
            await engine.shutdown()

    alone, beside, layers = asyncio.run(main())
    assert layers == [[0, 3, True]]
    assert beside == alone and len(alone) == 24
