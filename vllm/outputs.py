"""What the engine returns: RequestOutput and CompletionOutput, as upstream vLLM."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.sequence import PositionLogprobs, RequestMetrics


@dataclass
class CompletionOutput:
    """One generated sequence of a request.

    Attributes:
        index: position among the request's ``n`` sequences.
        text: generated text (tokenizer.decode of ``token_ids``, cut at a stop string).
        token_ids: generated token ids.
        cumulative_logprob: sum of the sampled tokens' logprobs (natural log).
        logprobs: per generated position, token id -> Logprob (when logprobs was asked).
        finish_reason: "stop", "length", "abort" or None while running.
        stop_reason: the stop string or stop token id that ended it, else None.
    """

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[PositionLogprobs] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """The state of one request after a step (or at its end when ``finished``)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[PositionLogprobs | None] | None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = field(default=0)
