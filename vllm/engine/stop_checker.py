"""Stop conditions, applied after every appended token (upstream vLLM's order).

1. min_tokens not reached: only the length limits can stop the sequence.
2. EOS (unless ignore_eos), then stop_token_ids: FINISHED_STOPPED, stop_reason = the id
   for stop_token_ids (None for EOS); the token's text is dropped when it is special and
   skip_special_tokens is set, as the decoder already does.
3. Stop strings: searched in the text added by this token (plus the longest stop string's
   length of earlier text, so strings spanning several tokens are found); the text is cut
   before the string (or after it with include_stop_str_in_output).
4. max_model_len reached (prompt + output), then max_tokens: FINISHED_LENGTH_CAPPED.
"""

from __future__ import annotations

from vllm.sampling_params import SamplingParams
from vllm.sequence import Sequence, SequenceStatus


def check_stop(seq: Sequence, new_chars: int, params: SamplingParams, max_model_len: int) -> None:
    """Set ``seq.status`` (and ``stop_reason``, truncated text) when the sequence ends.

    Args:
        seq: the sequence, with its new token appended and its text updated.
        new_chars: characters the new token added to ``seq.output_text``.
        params: its sampling params.
        max_model_len: the engine's context limit in tokens.
    """
    out_len = seq.get_output_len()
    if out_len >= params.min_tokens:
        last = seq.get_last_token_id()
        if not params.ignore_eos and seq.eos_token_id is not None and last == seq.eos_token_id:
            seq.status = SequenceStatus.FINISHED_STOPPED
            return
        if last in params.all_stop_token_ids:
            seq.status = SequenceStatus.FINISHED_STOPPED
            seq.stop_reason = last
            return
        if params.stop and _check_stop_strings(seq, new_chars, params):
            return
    if seq.get_len() >= max_model_len:
        seq.status = SequenceStatus.FINISHED_LENGTH_CAPPED
        return
    if params.max_tokens is not None and out_len >= params.max_tokens:
        seq.status = SequenceStatus.FINISHED_LENGTH_CAPPED


def _check_stop_strings(seq: Sequence, new_chars: int, params: SamplingParams) -> bool:
    if new_chars <= 0:
        return False
    text = seq.output_text
    longest = max(len(s) for s in params.stop)
    start = max(0, len(text) - new_chars - longest + 1)
    best: tuple[int, str] | None = None
    for s in params.stop:
        i = text.find(s, start)
        if i != -1 and (best is None or i < best[0]):
            best = (i, s)
    if best is None:
        return False
    i, s = best
    seq.output_text = text[: i + len(s)] if params.include_stop_str_in_output else text[:i]
    seq.status = SequenceStatus.FINISHED_STOPPED
    seq.stop_reason = s
    return True
