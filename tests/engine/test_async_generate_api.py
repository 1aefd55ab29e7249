"""``SamplingParams.output_kind`` and ``abort`` on ``AsyncLLMEngine.generate``: DELTA
outputs, joined, equal the CUMULATIVE run's final output (token ids, text, logprobs; n = 2,
seeded), one per cumulative output; FINAL_ONLY yields the final output alone; an abort from
the consumer ends its stream with an "abort" output."""

import asyncio
import re

import pytest

from vllm.sampling_params import RequestOutputKind, SamplingParams


def test_bad_output_kind_names_the_field():
    with pytest.raises(ValueError, match="output_kind must be one of .*DELTA.*got 7"):
        SamplingParams(output_kind=7)
    assert SamplingParams(output_kind=1).output_kind is RequestOutputKind.DELTA


@pytest.mark.forked
def test_delta_and_final_only_equal_cumulative(tiny_llama_dir):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.engine.async_llm_engine import AsyncLLMEngine

    args = EngineArgs(model=tiny_llama_dir, device="cpu", max_model_len=128)
    prompt = {"prompt_token_ids": [11, 42, 7, 99, 5, 17]}

    def params(kind):
        return SamplingParams(
            n=2, temperature=1.0, seed=3, max_tokens=12, logprobs=2, prompt_logprobs=1,
            output_kind=kind, ignore_eos=True,
        )  # fmt: skip

    async def main():
        engine = AsyncLLMEngine(args, log_requests=False)
        runs = {}
        try:
            for kind in RequestOutputKind:
                runs[kind] = [o async for o in engine.generate(prompt, params(kind), kind.name)]
        finally:
            await engine.shutdown()
        return runs

    runs = asyncio.run(main())
    cumulative, delta, final = (runs[k] for k in RequestOutputKind)
    want = cumulative[-1]
    assert len(cumulative) > 2 and len(delta) == len(cumulative)
    assert len(final) == 1 and final[0].finished
    for i in range(2):
        ref = want.outputs[i]
        got = final[0].outputs[i]
        assert (got.token_ids, got.text) == (ref.token_ids, ref.text)
        parts = [o.outputs[i] for o in delta]
        assert [t for p in parts for t in p.token_ids] == ref.token_ids
        assert "".join(p.text for p in parts) == ref.text
        lps = [lp for p in parts for lp in p.logprobs]
        assert [sorted(lp) for lp in lps] == [sorted(lp) for lp in ref.logprobs]
        assert parts[-1].finish_reason == "length" and parts[-1].cumulative_logprob == (
            ref.cumulative_logprob
        )
    assert len(set(want.outputs[0].token_ids) ^ set(want.outputs[1].token_ids)) > 0
    assert delta[0].prompt_logprobs == want.prompt_logprobs
    assert all(o.prompt_logprobs is None for o in delta[1:])
    assert sum(len(o.outputs[0].token_ids) == 1 for o in delta) >= 10  # one token per step


@pytest.mark.forked
def test_abort_ends_the_stream_with_an_abort_output(tiny_llama_dir):
    """``await engine.abort(id)`` from the consumer ends its stream with a finished output
    whose finish_reason is "abort" (not a hang); another request runs on untouched; the
    tokenizer and model config are there as upstream's async getters."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.engine.async_llm_engine import AsyncLLMEngine

    args = EngineArgs(model=tiny_llama_dir, device="cpu", max_model_len=128)
    sp = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)

    async def main():
        engine = AsyncLLMEngine(args, log_requests=False)
        try:
            assert (await engine.get_model_config()).max_model_len == 128
            assert (await engine.get_tokenizer()) is engine.tokenizer
            with pytest.raises(ValueError, match="the engine runs without LoRA"):
                await anext(engine.generate("x", sp, "l", lora_request=object()))
            # upstream's keyword names
            gen = engine.generate(prompt={"prompt_token_ids": [3]}, sampling_params=sp,
                                  request_id="kw")  # fmt: skip
            assert len([o async for o in gen][-1].outputs[0].token_ids) == 40

            async def aborted():
                outs = []
                async for out in engine.generate({"prompt_token_ids": [5, 6, 7]}, sp, "a"):
                    outs.append(out)
                    if len(outs) == 3:
                        await engine.abort("a")
                return outs

            async def other():
                return [o async for o in engine.generate({"prompt_token_ids": [8, 9]}, sp, "b")]

            return await asyncio.wait_for(asyncio.gather(aborted(), other()), 120)
        finally:
            await engine.shutdown()

    outs, rest = asyncio.run(main())
    last = outs[-1]
    assert last.finished and last.outputs[0].finish_reason == "abort", last
    assert 3 <= len(last.outputs[0].token_ids) < 40
    assert (
        rest[-1].outputs[0].finish_reason == "length" and len(rest[-1].outputs[0].token_ids) == 40
    )


@pytest.mark.forked
def test_request_ids_stay_unique(tiny_llama_dir):
    """Two requests in flight under one id: without ``dedupe_request_id`` the second is
    refused (also when both wait for a grammar, where the check and the claim were once
    split by an await: the second then replaced the first's stream and the first never
    ended); with it the second runs as ``<id>-<8 hex digits>`` and both get all their
    tokens under their own ids."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.engine.async_llm_engine import AsyncLLMEngine
    from vllm.sampling_params import GuidedDecodingParams

    args = EngineArgs(model=tiny_llama_dir, device="cpu", max_model_len=128)
    sp = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    guided = SamplingParams(
        temperature=0.0, max_tokens=8, guided_decoding=GuidedDecodingParams(regex="[ab]{8}")
    )
    prompt = {"prompt_token_ids": [5, 6, 7]}

    async def run(gen):
        try:
            return [o async for o in gen]
        except ValueError as e:
            return e

    async def main():
        engine = AsyncLLMEngine(args, log_requests=False)
        try:
            # both claim "g" while their grammar compiles
            both = await asyncio.wait_for(
                asyncio.gather(run(engine.generate(prompt, guided, "g")),
                               run(engine.generate(prompt, guided, "g"))), 120,
            )  # fmt: skip
            first = engine.generate(prompt, sp, "x")
            head = await anext(first)
            refused = await run(engine.generate(prompt, sp, "x"))
            second = await run(engine.generate(prompt, sp, "x", dedupe_request_id=True))
            rest = [o async for o in first]
            return both, [head, *rest], refused, second
        finally:
            await engine.shutdown()

    both, first, refused, second = asyncio.run(main())
    errors = [r for r in both if isinstance(r, ValueError)]
    [ok] = [r for r in both if not isinstance(r, ValueError)]
    assert len(errors) == 1 and "request id 'g' is already running" in str(errors[0])
    assert ok[-1].request_id == "g" and re.fullmatch("[ab]{8}", ok[-1].outputs[0].text)
    assert isinstance(refused, ValueError) and "'x' is already running" in str(refused)
    assert {o.request_id for o in first} == {"x"}
    assert len(first[-1].outputs[0].token_ids) == 30 and first[-1].finished
    ids = {o.request_id for o in second}
    [rid] = ids
    assert rid.startswith("x-") and len(rid) == len("x-") + 8, rid
    assert len(second[-1].outputs[0].token_ids) == 30 and second[-1].finished
    assert second[-1].outputs[0].token_ids == first[-1].outputs[0].token_ids  # greedy
