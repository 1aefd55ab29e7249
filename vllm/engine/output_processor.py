"""One step's samples into sequence state, and sequence groups into RequestOutputs.

This is the engine's per-token host loop (it runs for every sequence of every step):
append the sampled token, detokenize it incrementally (detokenizer.py), apply the stop
conditions (stop_checker.py). A speculative or multi-step step may carry several tokens per
sequence (``SequenceOutput.extra_tokens``): they are appended one by one with the same
checks after each, and nothing after a stop is kept. Without stop strings the checks read
only token ids and lengths, so the chunk is appended up to its first stopping token in one
go, checked once and detokenized once at its end (:func:`_append_chunk`): the same result
with less per-token host work at large batches.
"""

from __future__ import annotations

from vllm.engine.detokenizer import decode_sequence_step
from vllm.engine.stop_checker import check_stop
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import SamplingParams
from vllm.sequence import (
    CompletionSequenceGroupOutput,
    PositionLogprobs,
    Sequence,
    SequenceGroup,
    SequenceStatus,
)


def append_samples(
    group: SequenceGroup,
    group_out: CompletionSequenceGroupOutput,
    tokenizer,
    max_model_len: int,
) -> None:
    """Append one step's samples of ``group`` (detokenize, check stops after each token).

    Args:
        group: the scheduled group; samples of its already finished sequences are skipped.
        group_out: one SequenceOutput per scheduled sequence (``parent_seq_id`` names it).
        tokenizer: the engine's tokenizer, or None (skip_tokenizer_init); used only when
            the request's ``detokenize`` is set.
        max_model_len: the context limit in tokens (prompt + output).
    """
    params = group.sampling_params
    seqs = group.seqs
    tok = tokenizer if params.detokenize else None
    for sample in group_out.samples:
        seq = seqs[0]
        if seq.seq_id != sample.parent_seq_id:  # n > 1
            seq = next(s for s in seqs if s.seq_id == sample.parent_seq_id)
        if seq.is_finished():
            continue
        extra = sample.extra_tokens
        # A multi-token chunk without stop strings is detokenized once, after its last
        # token: the token-based checks (EOS, stop_token_ids, min_tokens, lengths) do not
        # read the text, and a sequence that stops inside the chunk gets its text from
        # check_stop's one-shot decode (finish_text). When the chunk ends inside a
        # multi-byte character its text is held back until a later step completes it.
        chunk = ((sample.output_token, sample.logprobs), *(extra or ()))
        if extra and not params.stop:
            # No stop strings: only token ids and lengths can stop the sequence, so the
            # tokens up to the first one that stops it are appended at once and checked once.
            _append_chunk(seq, chunk, params, max_model_len, tok)
            if tok is not None and not seq.is_finished():
                decode_sequence_step(tok, seq, params)
            continue
        detok_each = tok is not None
        for token, logprobs in chunk:
            if seq.is_finished():
                break
            seq.append_token_id(token, logprobs)
            new_chars = decode_sequence_step(tok, seq, params) if detok_each else 0
            check_stop(seq, new_chars, params, max_model_len, tok)


def _append_chunk(
    seq: Sequence,
    chunk: tuple[tuple[int, PositionLogprobs], ...],
    params: SamplingParams,
    max_model_len: int,
    tokenizer,
) -> None:
    """Append a multi-token chunk to ``seq`` when the request has no stop strings: the
    same tokens, logprobs, cumulative logprob and finish state as appending them one by
    one with :func:`check_stop` after each.

    Without stop strings :func:`check_stop` stops at a token only by its id (EOS unless
    ``ignore_eos``, ``stop_token_ids``, both once ``min_tokens`` are out) or by the length
    limits (``max_model_len`` for prompt + output, ``max_tokens``), and does nothing at the
    tokens before. So the first such token ends the chunk, everything up to it is appended,
    and one :func:`check_stop` on it sets the status and text exactly as the per-token loop.
    The cumulative logprob is summed token by token, in the same order (same rounding).
    """
    data = seq.data
    out_ids = data.output_token_ids
    prompt_len = len(data.prompt_token_ids)
    eos = None if params.ignore_eos else seq.eos_token_id
    stops = params.stop_token_ids
    min_tokens, max_tokens = params.min_tokens, params.max_tokens
    cap = max_model_len - prompt_len  # output length that reaches max_model_len
    if max_tokens is not None:
        cap = min(cap, max_tokens)
    n = len(out_ids)
    end = len(chunk)
    for j, (token, _) in enumerate(chunk):
        n += 1  # the output length with this token
        if n >= cap or (n >= min_tokens and (token == eos or token in stops)):
            end = j + 1
            break
    logprobs_out = seq.output_logprobs
    total = data.cumulative_logprob
    for token, logprobs in chunk[:end] if end < len(chunk) else chunk:
        out_ids.append(token)
        logprobs_out.append(logprobs)
        lp = logprobs.get(token)
        total += lp.logprob if lp is not None else 0.0
    data.cumulative_logprob = total
    check_stop(seq, 0, params, max_model_len, tokenizer)


def make_request_output(group: SequenceGroup) -> RequestOutput:
    """Snapshot a group as a RequestOutput (texts, copies of the token ids and logprobs
    lists, finish reasons); ``finished`` when every sequence of the group is."""
    p = group.sampling_params
    outs = []
    for i, seq in enumerate(group.seqs):
        outs.append(
            CompletionOutput(
                index=i,
                text=seq.output_text,
                token_ids=list(seq.output_token_ids),
                cumulative_logprob=seq.data.cumulative_logprob,
                logprobs=list(seq.output_logprobs) if p.logprobs is not None else None,
                finish_reason=SequenceStatus.get_finished_reason(seq.status),
                stop_reason=seq.stop_reason,
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
    )
