"""Engine-level scheduling: preemption by recompute and the max_model_len boundary."""

import pytest

from tests.utils import check_outputs_equal, completion_tuple, vllm_greedy

PROMPTS = [
    "The capital of France is",
    "Hello, my name is",
    "a b c d e f g",
    "List three colors:",
    "Once upon a time, there was",
    "Water boils at",
]


@pytest.mark.forked
def test_preemption_recompute_equals_roomy_run(tiny_llama_dir):
    from vllm import LLM

    roomy = LLM(model=tiny_llama_dir, device="cpu", block_size=16)
    ref = vllm_greedy(roomy, PROMPTS, 48)
    del roomy
    # 12 blocks of 16 tokens cannot hold 6 sequences of ~8 + 48 tokens: preemption must occur.
    tight = LLM(
        model=tiny_llama_dir,
        device="cpu",
        block_size=16,
        num_gpu_blocks_override=12,
        max_model_len=128,
    )
    out = vllm_greedy(tight, PROMPTS, 48)
    preempted = sum(s.num_cumulative_preemption for s in tight.llm_engine.schedulers)
    assert preempted > 0, "the tight run never preempted: the test proves nothing"
    check_outputs_equal(ref, out, "roomy", "preempted", PROMPTS)
    for s in tight.llm_engine.schedulers:  # every block returned
        assert (
            s.block_manager.get_num_free_gpu_blocks() == s.block_manager.get_num_total_gpu_blocks()
        )


@pytest.mark.forked
def test_max_model_len_boundary_beside_other_requests(tiny_llama_dir):
    from vllm import LLM, SamplingParams

    limit = 64
    llm = LLM(model=tiny_llama_dir, device="cpu", max_model_len=limit)
    normal = {"prompt_token_ids": list(range(100, 110))}
    prompts = [
        normal,
        {"prompt_token_ids": list(range(200, 200 + limit - 1))},
        {"prompt_token_ids": list(range(300, 300 + limit))},
        normal,
    ]
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    # One token too long: refused before anything is queued, naming the limit.
    too_long = {"prompt_token_ids": list(range(400, 400 + limit + 1))}
    with pytest.raises(ValueError, match="prompt \\(65 tokens\\) is longer than max_model_len=64"):
        llm.generate(prompts[:3] + [too_long], sp)
    assert not llm.llm_engine.has_unfinished_requests()
    outs = llm.generate(prompts, sp)
    got = [(len(o.outputs[0].token_ids), o.outputs[0].finish_reason) for o in outs]
    assert got == [(8, "length"), (1, "length"), (1, "length"), (8, "length")]
    assert outs[0].outputs[0].token_ids == outs[3].outputs[0].token_ids
    # The engine is still usable and unchanged afterwards.
    again = llm.generate([normal], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert again[0].outputs[0].token_ids == outs[0].outputs[0].token_ids


@pytest.mark.forked
def test_priority_policy_order_and_equal_outputs(tiny_llama_dir):
    """--scheduling-policy priority: with one sequence at a time the requests start in
    priority order; under KV pressure (preemption from the lowest priority) every output
    equals the roomy FCFS run's; FCFS refuses non-zero priorities before queueing."""
    from vllm import LLM, SamplingParams

    greedy = SamplingParams(temperature=0, max_tokens=48)
    roomy = LLM(model=tiny_llama_dir, device="cpu", block_size=16)
    ref = vllm_greedy(roomy, PROMPTS, 48)
    with pytest.raises(ValueError, match=r"got priority=2 but priority scheduling is not enabled"):
        roomy.generate(PROMPTS, greedy, use_tqdm=False, priority=[0, 2, 0, 0, 0, 0])
    assert roomy.llm_engine.get_num_unfinished_requests() == 0
    del roomy

    priority = [3, 1, 2, 0, 5, 4]
    one = LLM(model=tiny_llama_dir, device="cpu", max_num_seqs=1, scheduling_policy="priority")
    outs = one.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=4), use_tqdm=False,
                        priority=priority)  # fmt: skip
    started = sorted(range(len(PROMPTS)), key=lambda i: outs[i].metrics.first_scheduled_time)
    assert started == sorted(range(len(PROMPTS)), key=lambda i: priority[i])
    with pytest.raises(ValueError, match=r"one integer per prompt \(6\)"):
        one.generate(PROMPTS, greedy, priority=[1])
    with pytest.raises(ValueError, match=r"priority must be an integer, got 1.5"):
        one.generate(PROMPTS, greedy, priority=[1.5] * 6)
    del one

    tight = LLM(model=tiny_llama_dir, device="cpu", block_size=16, num_gpu_blocks_override=12,
                max_model_len=128, scheduling_policy="priority")  # fmt: skip
    outs = tight.generate(PROMPTS, greedy, use_tqdm=False, priority=priority)
    assert sum(s.num_cumulative_preemption for s in tight.llm_engine.schedulers) > 0
    check_outputs_equal(ref, [completion_tuple(o) for o in outs], "fcfs", "priority", PROMPTS)


@pytest.mark.forked
def test_cache_smaller_than_max_model_len_is_refused_at_start(tiny_llama_dir, monkeypatch):
    """A KV cache that cannot hold one max_model_len sequence is a start-up error (as
    upstream), not requests cut short at whatever length the cache allows."""
    from vllm import LLM, SamplingParams

    match = (r"max_model_len=128 is larger than the 48 tokens the KV cache holds per virtual "
             r"engine \(3 blocks of 16\).*at most 48")  # fmt: skip
    with pytest.raises(ValueError, match=match):
        LLM(model=tiny_llama_dir, device="cpu", num_gpu_blocks_override=3, max_model_len=128)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.00001")  # 10 KiB: no block at all
    with pytest.raises(ValueError, match=r"No KV-cache blocks fit .*VLLM_CPU_KVCACHE_SPACE"):
        LLM(model=tiny_llama_dir, device="cpu", max_model_len=48)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE")
    llm = LLM(model=tiny_llama_dir, device="cpu", num_gpu_blocks_override=3, max_model_len=48)
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    out = llm.generate({"prompt_token_ids": [5, 6, 7]}, params, use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 45 and out.finish_reason == "length"  # the context is full


@pytest.mark.forked
def test_n2_request_whose_recompute_exceeds_the_budget_is_never_cut_short(tiny_llama_dir):
    """Without chunked prefill, an n = 2 request whose two sequences (prompt + outputs)
    outgrow max_num_batched_tokens together could never be recomputed: when the cache runs
    out, the earlier request gives way instead, and both equal a roomy run. Guards: the n = 2
    request (the last running one) was preempted, then finished as ignored with 35 of its
    60 tokens ("length")."""
    from vllm import LLM, SamplingParams

    hog = {"prompt_token_ids": [(7 * i) % 40000 + 100 for i in range(30)]}
    pair = {"prompt_token_ids": [(13 * i) % 40000 + 300 for i in range(50)]}
    hog_sp = SamplingParams(temperature=0, max_tokens=90, ignore_eos=True)
    pair_sp = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True, n=2)
    roomy = LLM(model=tiny_llama_dir, device="cpu", max_model_len=128, enable_prefix_caching=False)
    ref = roomy.generate([hog, pair], [hog_sp, pair_sp], use_tqdm=False)
    del roomy
    # 16 blocks of 16: the pair (2 x 110 tokens at most, 14 blocks) and hog (120, 8 blocks)
    # cannot both finish in the cache; a recompute of the pair at 2 x 65+ tokens is > 128.
    tight = LLM(model=tiny_llama_dir, device="cpu", max_model_len=128, max_num_seqs=8,
                max_num_batched_tokens=128, num_gpu_blocks_override=16,
                enable_prefix_caching=False)  # fmt: skip
    engine = tight.llm_engine
    engine.add_request("hog", hog, hog_sp)
    engine.step()  # hog runs first, the pair joins behind it
    engine.add_request("pair", pair, pair_sp)
    final = {}
    while engine.has_unfinished_requests():
        final.update({o.request_id: o for o in engine.step() if o.finished})
    assert engine.schedulers[0].num_cumulative_preemption == 1
    for rid, want in zip(("hog", "pair"), ref):
        got = [(c.token_ids, c.finish_reason) for c in final[rid].outputs]
        assert got == [(c.token_ids, "length") for c in want.outputs], rid
        assert len(set(want.outputs[0].token_ids)) > 10  # not one repeated token
    assert [len(c.token_ids) for c in final["pair"].outputs] == [60, 60]
    bm = engine.schedulers[0].block_manager
    assert bm.get_num_free_gpu_blocks() == bm.get_num_total_gpu_blocks()


# a cycle of 8 token ids that the chain model below repeats forever
CYCLE = list(range(100, 108))


@pytest.fixture
def cycle_chain_dir(tmp_path):
    """A 1-layer Llama whose greedy next token after CYCLE[i] is CYCLE[i + 1 mod 8]
    (tiny_tokenizers.save_token_chain_llama): n-gram proposals of a cycling prompt are
    all accepted."""
    import tiny_tokenizers

    chain = tiny_tokenizers.chain_of([CYCLE + CYCLE[:1]])
    tok = tiny_tokenizers.byte_fallback_tokenizer()
    return tiny_tokenizers.save_token_chain_llama(tok, str(tmp_path / "cycle"), chain)


@pytest.mark.forked
@pytest.mark.parametrize(
    "extra",
    [
        dict(num_scheduler_steps=8),
        dict(speculative_model="[ngram]", num_speculative_tokens=4, ngram_prompt_lookup_max=4),
    ],
    ids=["multi_step", "ngram"],
)
def test_lookahead_near_max_model_len_needs_no_preemption(cycle_chain_dir, extra):
    """A lone request in a cache that holds exactly one max_model_len sequence (4 blocks
    of 16, limit 64) runs to the limit without a preemption: the lookahead slots of
    multi-step and speculative decoding stop at the last position a sequence feeds the
    model (they went past it, and the request was recomputed for each of its last
    tokens). The 14 tokens continue the cycle, finish "length"."""
    from vllm import LLM, SamplingParams

    prompt = {"prompt_token_ids": (CYCLE * 7)[:50]}
    want = (CYCLE * 9)[50:64]
    llm = LLM(model=cycle_chain_dir, device="cpu", max_model_len=64, block_size=16,
              num_gpu_blocks_override=4, **extra)  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=None, ignore_eos=True)
    got = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0]
    assert (list(got.token_ids), got.finish_reason) == (want, "length")
    engine = llm.llm_engine
    assert engine.schedulers[0].num_cumulative_preemption == 0
    if "speculative_model" in extra:  # the speculative path ran, and was right
        metrics = engine.spec_decode_metrics()
        assert metrics["num_accepted_tokens"] == metrics["num_draft_tokens"] > 0, metrics
