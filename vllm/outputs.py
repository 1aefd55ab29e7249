"""What the engine returns: RequestOutput and CompletionOutput, as upstream vLLM."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

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
        lora_request: the request's LoRA adapter (vllm.lora.request.LoRARequest), or None.
        num_cut_tokens: tokens generated for this sequence that a stop string cut off
            after they were appended (``Sequence.num_cut_tokens``): not in ``token_ids``,
            but generated all the same; see :meth:`num_generated_tokens`.
    """

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[PositionLogprobs] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    lora_request: object = None
    num_cut_tokens: int = 0

    def finished(self) -> bool:
        return self.finish_reason is not None

    def num_generated_tokens(self) -> int:
        """Tokens generated for this sequence so far: ``token_ids`` and the tokens a stop
        string cut off (never decreases between a request's cumulative outputs; on a
        delta output, ``token_ids`` holds only the new ids, so use it on cumulative
        ones)."""
        return len(self.token_ids) + self.num_cut_tokens


@dataclass
class RequestOutput:
    """The state of one request after a step (or at its end when ``finished``);
    ``lora_request`` is the request's LoRA adapter (vllm.lora.request.LoRARequest) or None,
    as upstream's."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[PositionLogprobs | None] | None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = field(default=0)
    lora_request: object = None


@dataclass
class PoolingOutput:
    """A pooling request's result: ``data``, the pooled vector (a float32 CPU tensor)."""

    data: object


@dataclass
class PoolingRequestOutput:
    """The result of one pooling request (``LLM.encode``, ``AsyncLLMEngine.encode``):
    upstream's shape, with ``outputs`` a :class:`PoolingOutput`."""

    request_id: str
    outputs: PoolingOutput
    prompt_token_ids: list[int]
    finished: bool
    prompt: str | None = None
    num_cached_tokens: int = 0


@dataclass
class EmbeddingOutput:
    """An embedding as a list of floats (``LLM.embed``)."""

    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class EmbeddingRequestOutput:
    """The result of one ``LLM.embed`` prompt (upstream's shape)."""

    request_id: str
    outputs: EmbeddingOutput
    prompt_token_ids: list[int]
    finished: bool

    @classmethod
    def from_base(cls, out: PoolingRequestOutput) -> EmbeddingRequestOutput:
        return cls(out.request_id, EmbeddingOutput(out.outputs.data.tolist()),
                   out.prompt_token_ids, out.finished)  # fmt: skip


@dataclass
class ScoringOutput:
    """A pair's score (``LLM.score``): the cosine similarity of its two embeddings."""

    score: float


@dataclass
class ScoringRequestOutput:
    """The result of one ``LLM.score`` pair (upstream's shape): ``prompt_token_ids`` are
    the first text's ids followed by the second's; ``request_id`` joins the two pooling
    requests' ids with ``_``."""

    request_id: str
    outputs: ScoringOutput
    prompt_token_ids: list[int]
    finished: bool


class DeltaOutputs:
    """Turns one request's cumulative RequestOutputs into deltas (``RequestOutputKind.DELTA``):
    each CompletionOutput keeps only the token ids, text and logprobs added since the last
    output this object returned; ``prompt_logprobs`` come only with the first.
    ``cumulative_logprob``, ``finish_reason`` and ``stop_reason`` are as given. Texts and
    token lists only grow between a request's outputs (the detokenizer's stable text), so
    slicing at the lengths already sent gives what is new.
    """

    def __init__(self) -> None:
        self._sent: dict[int, tuple[int, int]] = {}  # index -> (tokens, characters) sent
        self._first = True

    def apply(self, out: RequestOutput) -> RequestOutput:
        outputs = []
        for o in out.outputs:
            tokens, chars = self._sent.get(o.index, (0, 0))
            outputs.append(
                replace(
                    o,
                    token_ids=list(o.token_ids[tokens:]),
                    text=o.text[chars:],
                    logprobs=None if o.logprobs is None else list(o.logprobs[tokens:]),
                )
            )
            self._sent[o.index] = (len(o.token_ids), len(o.text))
        first, self._first = self._first, False
        return replace(out, outputs=outputs, prompt_logprobs=out.prompt_logprobs if first else None)
