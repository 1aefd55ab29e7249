"""What an embedding request asks of the pooler (upstream's ``PoolingParams``)."""

from __future__ import annotations

from dataclasses import dataclass

from vllm.sampling_params import RequestOutputKind


@dataclass
class PoolingParams:
    """Parameters of one pooling (embedding) request.

    Args:
        dimensions: keep the first ``dimensions`` values of the embedding (normalized
            after the cut when the request normalizes); only for models trained for it (Matryoshka
            representations: ``is_matryoshka`` or ``matryoshka_dimensions`` in the Hugging
            Face config). None: the whole hidden size.
        normalize: L2-normalize the embedding (True) or return the raw pooled vector
            (False); None: the pooler config's ``normalize`` (``--override-pooler-config``,
            default True).
        truncate_prompt_tokens: keep only the last this many prompt tokens (None: all; -1:
            the last ``max_model_len``, as SamplingParams' field).
        output_kind: as SamplingParams' (an embedding arrives once, when it is done).

    Raises:
        ValueError: ``dimensions`` below 1, ``truncate_prompt_tokens`` below 1 and not -1,
            ``normalize`` not a bool or None.
    """

    dimensions: int | None = None
    normalize: bool | None = None
    truncate_prompt_tokens: int | None = None
    output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY
    guided_decoding: None = None  # no constrained decoding in pooling

    def __post_init__(self) -> None:
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise ValueError(f"normalize must be true, false or None, got {self.normalize!r}.")
        for name in ("dimensions", "truncate_prompt_tokens"):
            value = getattr(self, name)
            if value is None or (name == "truncate_prompt_tokens" and value == -1):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                also = " (or -1 for max_model_len)" if name == "truncate_prompt_tokens" else ""
                raise ValueError(f"{name} must be a positive integer{also} or None, got {value!r}.")
