"""One step's samples into sequence state, and sequence groups into RequestOutputs.

This is the engine's per-token host loop (it runs for every sequence of every step):
append the sampled token, detokenize it incrementally (detokenizer.py), apply the stop
conditions (stop_checker.py). A speculative or multi-step step may carry several tokens per
sequence (``SequenceOutput.token_ids``): they are appended one by one with the same
checks after each, and nothing after a stop is kept. Without stop strings the checks read
only token ids and lengths, so the chunk is appended up to its first stopping token in one
go (``stop_checker.tokens_until_stop``), checked once and detokenized once at its end: the
same result with less per-token host work at large batches.
"""

from __future__ import annotations

from vllm.engine.detokenizer import decode_sequence_step, finish_text
from vllm.engine.stop_checker import check_stop, tokens_until_stop
from vllm.engine.token_text import fill_decoded_tokens
from vllm.outputs import CompletionOutput, PoolingOutput, PoolingRequestOutput, RequestOutput
from vllm.sequence import CompletionSequenceGroupOutput, SequenceGroup, SequenceStatus


def append_samples(
    group: SequenceGroup,
    group_out: CompletionSequenceGroupOutput,
    tokenizer,
    max_model_len: int,
    defer_text: bool = False,
) -> bool:
    """Append one step's samples of ``group`` (detokenize, check stops after each token).

    Args:
        group: the scheduled group; samples of its already finished sequences are skipped.
        group_out: one SequenceOutput per scheduled sequence (``parent_seq_id`` names it).
        tokenizer: the engine's tokenizer, or None (skip_tokenizer_init); used only when
            the request's ``detokenize`` is set.
        max_model_len: the context limit in tokens (prompt + output).
        defer_text: leave the text of a request without stop strings to
            :func:`finish_text_of` (async output processing): its stop conditions read
            only token ids and lengths, so whether and where it stops is decided here all
            the same. A request with stop strings is detokenized here regardless.
    Returns:
        True when the group's text was deferred (call :func:`finish_text_of` next).
    """
    params = group.sampling_params
    seqs = group.seqs
    tok = tokenizer if params.detokenize else None
    deferred = defer_text and tok is not None and not params.stop
    if deferred:
        tok = None  # check_stop without a tokenizer decides the same, without any text
    for sample in group_out.samples:
        seq = seqs[0]
        if seq.seq_id != sample.parent_seq_id:  # n > 1
            seq = next(s for s in seqs if s.seq_id == sample.parent_seq_id)
        if seq.is_finished():
            continue
        seq.text_pending = deferred
        ids, lps = sample.token_ids, sample.token_logprobs
        positions = sample.positions if seq.keep_logprobs else None
        if params.detokenize:
            fill_decoded_tokens(tokenizer, positions)
        # A multi-token chunk without stop strings is detokenized once, after its last
        # token: the token-based checks (EOS, stop_token_ids, min_tokens, lengths) do not
        # read the text, and a sequence that stops inside the chunk gets its text from
        # check_stop's one-shot decode (finish_text). When the chunk ends inside a
        # multi-byte character its text is held back until a later step completes it.
        if len(ids) > 1 and not params.stop:
            # No stop strings: only token ids and lengths can stop the sequence, so the
            # tokens up to the first one that stops it are appended at once, checked once.
            n = tokens_until_stop(seq, ids, params, max_model_len)
            seq.append_tokens(ids[:n], lps[:n], positions[:n] if positions else None)
            check_stop(seq, 0, params, max_model_len, tok)
            if tok is not None and not seq.is_finished():
                decode_sequence_step(tok, seq, params)
            continue
        detok_each = tok is not None
        for i in range(len(ids)):
            if seq.is_finished():
                break
            if len(ids) == 1:  # the usual one-token step: its lists as they are
                seq.append_tokens(ids, lps, positions)
            else:
                pos = positions[i : i + 1] if positions else None
                seq.append_tokens(ids[i : i + 1], lps[i : i + 1], pos)
            new_chars = decode_sequence_step(tok, seq, params) if detok_each else 0
            check_stop(seq, new_chars, params, max_model_len, tok)
    return deferred


def finish_text_of(group: SequenceGroup, tokenizer) -> None:
    """Decode the text :func:`append_samples` deferred, for every sequence of ``group``
    that has some: the text it would have made, since without stop strings
    :func:`~vllm.engine.stop_checker.check_stop` only adds a finished sequence's one-shot
    decode (less a stopping EOS or stop token unless ``include_stop_str_in_output``) and a
    running sequence gets its incremental decode."""
    params = group.sampling_params
    for seq in group.seqs:
        if not seq.text_pending:
            continue
        seq.text_pending = False
        status = seq.status
        if status == SequenceStatus.FINISHED_STOPPED:
            finish_text(tokenizer, seq, params, drop_last=not params.include_stop_str_in_output)
        elif status == SequenceStatus.FINISHED_LENGTH_CAPPED:
            finish_text(tokenizer, seq, params, drop_last=False)
        else:  # running, or aborted since: the text so far
            decode_sequence_step(tokenizer, seq, params)


def stop_holdback(params) -> int:
    """Characters of a running sequence's text held back from its RequestOutputs: one
    less than the longest stop string (0 without stop strings or with
    ``include_stop_str_in_output``). The tail of the text may be the start of a stop
    string, which the final text drops; holding it back keeps every streamed text a
    prefix of the final one (upstream V1 holds back the same amount)."""
    if not params.stop or params.include_stop_str_in_output:
        return 0
    return max(len(s) for s in params.stop) - 1


def make_request_output(group: SequenceGroup) -> RequestOutput | PoolingRequestOutput:
    """Snapshot a group as a RequestOutput (texts, copies of the token ids and logprobs
    lists, finish reasons); ``finished`` when every sequence of the group is. A running
    sequence's text omits its last :func:`stop_holdback` characters. A pooling request
    (embedding engines) gives a PoolingRequestOutput with its vector."""
    if group.pooling_params is not None:
        return PoolingRequestOutput(
            request_id=group.request_id,
            outputs=PoolingOutput(group.pooled),
            prompt_token_ids=list(group.prompt_token_ids),
            finished=group.is_finished(),
            prompt=group.prompt,
            num_cached_tokens=group.num_cached_tokens or 0,
        )
    p = group.sampling_params
    hold = stop_holdback(p)
    outs = []
    for i, seq in enumerate(group.seqs):
        text = seq.output_text
        if hold and not seq.is_finished():
            text = text[: max(0, len(text) - hold)]
        outs.append(
            CompletionOutput(
                index=i,
                text=text,
                token_ids=list(seq.output_token_ids),
                cumulative_logprob=seq.data.cumulative_logprob,
                logprobs=list(seq.output_logprobs) if p.logprobs is not None else None,
                finish_reason=SequenceStatus.get_finished_reason(seq.status),
                stop_reason=seq.stop_reason,
                lora_request=group.lora_request,
                num_cut_tokens=seq.num_cut_tokens,
            )
        )
    return RequestOutput(
        request_id=group.request_id,
        prompt=group.prompt,
        prompt_token_ids=list(group.prompt_token_ids),
        prompt_logprobs=group.prompt_logprobs if p.prompt_logprobs is not None else None,
        outputs=outs,
        finished=group.is_finished(),
        metrics=group.metrics,
        num_cached_tokens=group.num_cached_tokens or 0,
        lora_request=group.lora_request,
    )
