"""What an embedding request asks of the pooler (upstream's ``PoolingParams``)."""

from __future__ import annotations

from dataclasses import dataclass

from vllm.sampling_params import RequestOutputKind


@dataclass
class PoolingParams:
    """Parameters of one pooling (embedding) request.

    Args:
        dimensions: keep the first ``dimensions`` values of the embedding (renormalized
            when the pooler normalizes); only for models trained for it (Matryoshka
            representations: ``is_matryoshka`` or ``matryoshka_dimensions`` in the Hugging
            Face config). None: the whole hidden size.
        truncate_prompt_tokens: keep only the last this many prompt tokens (None: all).
        output_kind: as SamplingParams' (an embedding arrives once, when it is done).

    Raises:
        ValueError: ``dimensions`` or ``truncate_prompt_tokens`` below 1.
    """

    dimensions: int | None = None
    truncate_prompt_tokens: int | None = None
    output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY
    guided_decoding: None = None  # no constrained decoding in pooling

    def __post_init__(self) -> None:
        for name in ("dimensions", "truncate_prompt_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):  # fmt: skip
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}.")
