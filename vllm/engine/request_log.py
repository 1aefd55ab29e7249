"""The server's request log (``vllm serve``, unless ``--disable-log-requests``): a line
when a request is received and, with ``--enable-log-outputs``, a line per generated
sequence when it finishes. Prompts and outputs are cut to ``--max-log-len`` characters
(token ids: that many ids)."""

from __future__ import annotations

import logging

from vllm.engine.llm_engine import PromptType
from vllm.lora.request import LoRARequest
from vllm.outputs import RequestOutput
from vllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


def log_request(
    request_id: str,
    prompt: PromptType,
    params: SamplingParams,
    lora_request: LoRARequest | None = None,
    max_log_len: int | None = None,
) -> None:
    """Log a request: its prompt as text (chat prompts rendered by their template) when
    the text is known, else its token ids; either cut to ``max_log_len`` characters / ids
    (None: all); then its LoRA adapter, when it names one (as upstream logs it)."""
    text, ids = None, None
    if isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, dict):
        text = prompt.get("prompt")
        ids = prompt.get("prompt_token_ids")
    else:
        ids = prompt
    n = max_log_len
    lora = "" if lora_request is None else f", lora_request: {lora_request}"
    if text is not None:
        logger.info(
            "Received request %s: prompt: %r, params: %s%s.", request_id, text[:n], params, lora
        )
    else:
        shown = list(ids or [])[:n]
        logger.info(
            "Received request %s: prompt_token_ids: %s, params: %s%s.", request_id, shown,
            params, lora,
        )  # fmt: skip


def log_output(out: RequestOutput, max_log_len: int | None = None) -> None:
    """Log a finished request's outputs (``--enable-log-outputs``), one INFO line per
    sequence, upstream's "Generated response" line: the request id (with the sequence's
    index when the request has several), the generated text and token ids, each cut to
    ``max_log_len`` characters / ids (None: all), and the finish reason. ``out`` must be
    cumulative (a delta output holds only the last step's text)."""
    n = max_log_len
    for o in out.outputs:
        which = f" (sequence {o.index})" if len(out.outputs) > 1 else ""
        logger.info(
            "Generated response %s%s: output: %r, output_token_ids: %s, finish_reason: %s.",
            out.request_id, which, o.text[:n], list(o.token_ids)[:n], o.finish_reason,
        )  # fmt: skip
