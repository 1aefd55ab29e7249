"""A step whose model call fails leaves nothing in the prefix cache that it was to write.

Blocks of a prefill are registered in the prefix cache when the step is scheduled (whole
prompts at allocation, chunks when scheduled). A failed model call aborts the step's
requests, but those hashes used to stay: the next request with the same prompt found its
prefix "cached" in blocks whose keys were never written and returned other tokens than a
fresh engine, silently. Here a request after a failed step equals a fresh engine's, with
``LLM`` (whole prompts; chunked prefill with multi-step decoding) and ``AsyncLLMEngine``
(the server's path).
"""

import asyncio
import gc
import random

import pytest

from tests.utils import completion_tuple

BS = 16
PROMPT = {"prompt_token_ids": [random.Random(9).randrange(10, 300) for _ in range(70)]}


def _params():
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=8, logprobs=2, ignore_eos=True)


def _args(**kw):
    return dict(model=kw.pop("model"), device="cpu", block_size=BS, max_model_len=128,
                num_gpu_blocks_override=64, **kw)  # fmt: skip


def _fresh(model):
    """The prompt's output from an engine without prefix caching."""
    from vllm import LLM

    llm = LLM(**_args(model=model, enable_prefix_caching=False))
    out = completion_tuple(llm.generate([PROMPT], _params(), use_tqdm=False)[0])
    llm.llm_engine.shutdown()
    del llm
    gc.collect()
    return out


def _fail_call(executor, which: int):
    """Make the executor's ``which``-th model call (1-based) raise once."""
    real = executor.execute_model
    calls = [0]

    def flaky(req):
        calls[0] += 1
        if calls[0] == which:
            raise RuntimeError("injected model failure")
        return real(req)

    executor.execute_model = flaky


def _assert_same(ref, got, what):
    assert got[0] == ref[0], f"{what}: {got[0]} != {ref[0]}"
    assert len(set(ref[0])) >= 3, "degenerate tiny-model output"
    for pos, (a, b) in enumerate(zip(ref[2], got[2])):
        assert a.keys() == b.keys() and all(abs(a[t] - b[t]) < 5e-5 for t in a), (what, pos)


@pytest.mark.forked
@pytest.mark.parametrize(
    "kw, which",
    [
        ({}, 1),  # the whole prompt's prefill fails
        # the second of five 16-token chunks fails (the first's blocks were written)
        (
            dict(
                enable_chunked_prefill=True,
                max_num_batched_tokens=BS,
                max_num_seqs=4,
                num_scheduler_steps=4,
            ),
            2,
        ),
    ],  # fmt: skip
    ids=["whole_prompt", "chunked_multi_step"],
)
def test_llm_after_a_failed_prefill_equals_a_fresh_engine(tiny_llama_dir, kw, which):
    from vllm import LLM

    ref = _fresh(tiny_llama_dir)
    llm = LLM(**_args(model=tiny_llama_dir, enable_prefix_caching=True, **kw))
    _fail_call(llm.llm_engine.executor, which)
    with pytest.raises(RuntimeError, match="injected model failure"):
        llm.generate([PROMPT], _params(), use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    got = completion_tuple(llm.generate([PROMPT], _params(), use_tqdm=False)[0])
    _assert_same(ref, got, f"after a failed step ({kw})")
    # what this run wrote is cached as usual: the third run reads it and still agrees
    again = completion_tuple(llm.generate([PROMPT], _params(), use_tqdm=False)[0])
    _assert_same(ref, again, "cached after the failure")
    assert llm.llm_engine.schedulers[0].block_manager.num_hit_tokens > 0
    llm.llm_engine.shutdown()


@pytest.mark.forked
def test_async_engine_after_a_failed_prefill_equals_a_fresh_engine(tiny_llama_dir):
    """The server's path: the failed request gets the error, the engine keeps serving,
    and the same prompt afterwards returns the fresh engine's tokens."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.engine.async_llm_engine import AsyncLLMEngine

    ref = _fresh(tiny_llama_dir)
    args = AsyncEngineArgs(**_args(model=tiny_llama_dir, enable_prefix_caching=True,
                                   enable_chunked_prefill=True, max_num_batched_tokens=BS,
                                   max_num_seqs=4, num_scheduler_steps=4))  # fmt: skip

    async def run():
        engine = AsyncLLMEngine.from_engine_args(args)
        _fail_call(engine.engine.executor, 3)
        outs = []
        for rid in ("failed", "after"):
            try:
                async for out in engine.generate(PROMPT, _params(), rid):
                    last = out
                outs.append(completion_tuple(last))
            except Exception as e:  # noqa: BLE001 - the injected failure, as the stream has it
                outs.append(e)
        await engine.shutdown()
        return outs

    failed, after = asyncio.run(run())
    assert "injected model failure" in str(failed), failed
    _assert_same(ref, after, "async engine after a failed step")


def _step_until_done(engine, prompts, params):
    """Add ``prompts`` as r0, r1, ... and step until none is left, catching every step's
    exception as a caller that keeps stepping does; returns ({id: output}, errors)."""
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params)
    done, errors = {}, []
    for _ in range(200):
        if not engine.has_unfinished_requests():
            break
        try:
            done.update((o.request_id, o) for o in engine.step() if o.finished)
        except RuntimeError as e:
            errors.append(str(e))
    return done, errors


@pytest.mark.forked
@pytest.mark.parametrize(
    "kw, which",
    [
        ({}, 1),  # every prompt's prefill fails
        # the third call: a mixed step of decodes and prompt chunks, earlier chunks written
        (dict(enable_chunked_prefill=True, max_num_batched_tokens=32, max_num_seqs=4), 3),
    ],  # fmt: skip
    ids=["whole_prompts", "chunked"],
)
def test_step_after_a_failed_prefill_runs_it_again(tiny_llama_dir, kw, which):
    """``LLMEngine.step`` callers that catch a failed model call and keep stepping: the
    failed step's prefills used to stay scheduled as done, so their requests decoded after
    a prompt whose KV was never written and returned other tokens, silently. Each request
    now ends with a fresh engine's tokens, and nothing stays allocated."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.engine.llm_engine import LLMEngine

    rng = random.Random(3)
    prompts = [{"prompt_token_ids": [rng.randrange(10, 300) for _ in range(40 + 7 * i)]}
               for i in range(4)]  # fmt: skip
    params = _params()
    outs = {}
    for fail in (False, True):
        engine = LLMEngine.from_engine_args(EngineArgs(**_args(model=tiny_llama_dir, **kw)))
        if fail:
            _fail_call(engine.executor, which)
        outs[fail] = _step_until_done(engine, prompts, params)
        sched = engine.schedulers[0]
        assert sched.block_manager.usage() == 0.0 and not sched.has_unfinished_seqs()
        engine.shutdown()
    (ref, no_errors), (got, errors) = outs[False], outs[True]
    assert no_errors == [] and errors == ["injected model failure"]
    assert sorted(got) == sorted(ref) == ["r0", "r1", "r2", "r3"]
    for rid in ref:
        _assert_same(completion_tuple(ref[rid]), completion_tuple(got[rid]), rid)
