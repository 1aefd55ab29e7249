"""What a step returns: every scheduled request's snapshot when streaming (the default, the
async engine's mode), only finished requests' outputs while the offline LLM.generate loop
runs; the results are the same either way. Plus the start-up objects' GC freeze."""

import gc

import pytest

PROMPTS = [{"prompt_token_ids": [1 + i, 5, 9, 11]} for i in range(5)]


def _drain(engine, max_tokens):
    from vllm import SamplingParams

    for i, p in enumerate(PROMPTS):
        sp = SamplingParams(temperature=0, max_tokens=max_tokens[i], ignore_eos=True, logprobs=1)
        engine.add_request(f"r{i}", p, sp)
    steps = []
    while engine.has_unfinished_requests():
        steps.append(engine.step())
    return steps


@pytest.mark.forked
def test_stream_outputs_off_returns_only_finished_with_the_same_results(tiny_llama_dir):
    from vllm import LLM

    llm = LLM(model=tiny_llama_dir, device="cpu", skip_tokenizer_init=True)
    engine = llm.llm_engine
    assert engine.stream_outputs  # default: the async engine streams every step
    lens = [3, 6, 1, 6, 4]
    streamed = _drain(engine, lens)
    # prefill: all 5 (r2 finishes there, max_tokens=1); first decode: the other 4, running
    assert [len(outs) for outs in streamed[:2]] == [5, 4]
    assert sum(not o.finished for o in streamed[1]) == 4
    final = {o.request_id: o for outs in streamed for o in outs if o.finished}
    engine.stream_outputs = False
    quiet = _drain(engine, lens)
    assert all(o.finished for outs in quiet for o in outs)
    got = {o.request_id: o for outs in quiet for o in outs}
    assert sorted(got) == sorted(final) == [f"r{i}" for i in range(5)]
    for rid, o in got.items():
        assert o.outputs[0].token_ids == final[rid].outputs[0].token_ids
        assert len(o.outputs[0].token_ids) == lens[int(rid[1:])]
        assert o.outputs[0].logprobs == final[rid].outputs[0].logprobs
    # LLM.generate turns streaming off for its own loop only, and restores it.
    engine.stream_outputs = True
    from vllm import SamplingParams

    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs][1] == got["r1"].outputs[0].token_ids
    assert engine.stream_outputs


@pytest.mark.forked
def test_engine_freezes_start_up_objects_and_shutdown_unfreezes(tiny_llama_dir):
    from vllm import LLM

    llm = LLM(model=tiny_llama_dir, device="cpu", skip_tokenizer_init=True)
    assert gc.get_freeze_count() > 0
    llm.llm_engine.shutdown()
    assert gc.get_freeze_count() == 0


@pytest.mark.forked
def test_step_honours_output_kind(tiny_llama_dir):
    """As upstream V0's ``LLMEngine.step``: a DELTA request's outputs carry only what is new
    since its previous one (joined, they are the CUMULATIVE request's final output), a
    FINAL_ONLY request's only its finished output. Guards: step() returned cumulative
    snapshots whatever the kind."""
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import RequestOutputKind

    llm = LLM(model=tiny_llama_dir, device="cpu", max_model_len=64)
    engine = llm.llm_engine
    for kind in RequestOutputKind:
        sp = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logprobs=1,
                            output_kind=kind)  # fmt: skip
        engine.add_request(kind.name, "Hello there", sp)
    seen = {k.name: [] for k in RequestOutputKind}
    while engine.has_unfinished_requests():
        for out in engine.step():
            seen[out.request_id].append(out)
    full = seen["CUMULATIVE"][-1].outputs[0]
    assert len(seen["CUMULATIVE"]) == 5 and len(set(full.token_ids)) >= 3
    deltas = [o.outputs[0] for o in seen["DELTA"]]
    assert [len(d.token_ids) for d in deltas] == [1] * 5
    assert [t for d in deltas for t in d.token_ids] == full.token_ids
    assert "".join(d.text for d in deltas) == full.text
    assert [lp for d in deltas for lp in d.logprobs] == full.logprobs
    assert [o.finished for o in seen["DELTA"]] == [False] * 4 + [True]
    (final,) = seen["FINAL_ONLY"]
    assert final.finished and final.outputs[0].token_ids == full.token_ids
    # an aborted DELTA request leaves nothing behind
    engine.add_request(
        "a", "Hello", SamplingParams(max_tokens=5, output_kind=RequestOutputKind.DELTA)
    )
    engine.step()
    engine.abort_request("a")
    assert engine._deltas == {}
