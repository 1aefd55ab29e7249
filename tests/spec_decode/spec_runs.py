"""Shared by the speculative-decoding tests that compare whole engine runs: one ``LLM`` run
over token-id prompts, its outputs as plain values, and the engine's speculative counters."""


def run_token_prompts(model, prompts, params, **kw):
    """Generate ``prompts`` (token-id lists) with ``params`` on a fresh CPU float32 ``LLM``
    (``kw`` its other arguments; max_num_seqs 8 unless given), then shut it down.

    Returns:
        (per prompt (first completion's token ids, its {id: logprob} per position or None),
        ``LLMEngine.spec_decode_metrics()``: None without speculation).
    """
    from vllm import LLM

    kw.setdefault("max_num_seqs", 8)
    llm = LLM(model=model, device="cpu", dtype="float32", **kw)
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        metrics = llm.llm_engine.spec_decode_metrics()
    finally:
        llm.llm_engine.shutdown()
    res = []
    for o in outs:
        c = o.outputs[0]
        lps = None
        if c.logprobs is not None:
            lps = [{t: lp.logprob for t, lp in pos.items()} for pos in c.logprobs]
        res.append((list(c.token_ids), lps))
    return res, metrics


def assert_runs_close(got, ref, rows, tol: float):
    """For each index in ``rows``: the same token ids, and per position the same top ids
    with logprobs within ``tol`` (None on both sides when no logprobs were asked)."""
    for i in rows:
        (g_ids, g_lp), (r_ids, r_lp) = got[i], ref[i]
        assert g_ids == r_ids, (i, g_ids, r_ids)
        assert (g_lp is None) == (r_lp is None), i
        for pos, (a, b) in enumerate(zip(r_lp or [], g_lp or [], strict=True)):
            assert a.keys() == b.keys(), (i, pos, a, b)
            assert all(abs(a[t] - b[t]) < tol for t in a), (i, pos, a, b)
