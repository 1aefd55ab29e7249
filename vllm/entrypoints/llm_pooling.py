"""The pooling half of the offline ``LLM`` class (upstream's ``LLM.encode``, ``embed``,
``score`` and ``classify``), on an engine started with ``task="embed"`` (vllm/pooling)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Sequence as SeqABC
from typing import Any

from vllm.inputs import PromptType, prompt_list
from vllm.lora.request import LoRARequest
from vllm.outputs import EmbeddingRequestOutput, PoolingRequestOutput, ScoringRequestOutput
from vllm.pooling.scoring import check_pairs, scoring_outputs
from vllm.pooling_params import PoolingParams


class PoolingMethods:
    """``LLM``'s pooling methods. The class they are mixed into provides ``llm_engine`` and
    ``_run_requests(prompts, params, use_tqdm, lora_request, priority, kind)`` (validate,
    queue and run every request; see ``LLM.generate``)."""

    def encode(
        self,
        prompts: PromptType | SeqABC[PromptType],
        pooling_params: PoolingParams | SeqABC[PoolingParams] | None = None,
        use_tqdm: bool | Callable[..., Any] = True,
        lora_request: LoRARequest | SeqABC[LoRARequest | None] | None = None,
        priority: list[int] | None = None,
        *,
        truncate_prompt_tokens: int | None = None,
        pooling_task: str | None = None,
    ) -> list[PoolingRequestOutput]:
        """Pool each prompt into one vector (an engine started with ``task="embed"``; see
        vllm/pooling): ``outputs.data`` a float32 tensor [hidden] (or ``dimensions``).
        Arguments and errors as for :meth:`generate`; a generative engine raises
        ValueError. ``truncate_prompt_tokens=k`` (as upstream) pools only each prompt's
        last k tokens (-1: the last ``max_model_len``), in place of the pooling params'
        own value. ``pooling_task`` (upstream's keyword) may be None or ``"embed"``, the
        one task served; another is a ValueError."""
        if pooling_task not in (None, "embed"):
            raise ValueError(
                f"pooling_task={pooling_task!r} is not supported: the pooling task served is "
                "'embed' (sequence embeddings)."
            )
        params = pooling_params or PoolingParams()
        if truncate_prompt_tokens is not None:
            params = _with_truncation(params, truncate_prompt_tokens)
        return self._run_requests(prompts, params, use_tqdm, lora_request, priority,
                                  PoolingParams)  # fmt: skip

    def embed(self, *args: Any, **kwargs: Any) -> list[EmbeddingRequestOutput]:
        """:meth:`encode` (the same arguments) with each vector as a list of floats
        (``outputs.embedding``), as upstream's ``LLM.embed``."""
        outs = self.encode(*args, **kwargs)
        return [EmbeddingRequestOutput.from_base(o) for o in outs]

    def score(
        self,
        text_1: PromptType | SeqABC[PromptType],
        text_2: PromptType | SeqABC[PromptType],
        /,
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool | Callable[..., Any] = True,
        pooling_params: PoolingParams | None = None,
        lora_request: LoRARequest | None = None,
    ) -> list[ScoringRequestOutput]:
        """Score text pairs on an embedding engine (``task="embed"``), as upstream scores
        them with an embedding model: a pair's score is the cosine similarity of its two
        texts' embeddings (vllm/pooling/scoring.py). One ``text_1`` and N ``text_2``
        (1-to-1, 1-to-N; the lone ``text_1`` is embedded once) or N of each (N-to-N, as
        ``zip``); each a prompt as :meth:`encode` takes it. ``truncate_prompt_tokens``,
        ``pooling_params`` and ``lora_request`` apply to every text, as in :meth:`encode`.

        Returns:
            One ScoringRequestOutput per pair, in pair order; ``outputs.score`` a float in
            [-1, 1].
        Raises:
            ValueError: a generative engine (cross-encoders, upstream's ``task="score"``,
                are not served), an empty list, N ``text_1`` for M != N ``text_2``, or
                anything :meth:`encode` refuses; nothing is queued then.
        """
        if self.llm_engine.config.pooler_config is None:
            raise ValueError(
                "LLM.score needs an embedding engine (task='embed'): scores are the cosine "
                "similarity of embeddings; cross-encoder models (task='score') are not served."
            )
        first, second = prompt_list(text_1), prompt_list(text_2)
        check_pairs(first, second)
        outs = self.encode(first + second, pooling_params, use_tqdm, lora_request,
                           truncate_prompt_tokens=truncate_prompt_tokens)  # fmt: skip
        return scoring_outputs(outs[: len(first)], outs[len(first) :])

    def classify(self, *args: Any, **kwargs: Any):
        """Upstream's ``classify`` (classification models): not served.

        Raises:
            ValueError: always (as upstream's on a model without a classification head);
                embeddings are the one pooling task here.
        """
        raise ValueError(
            "LLM.classify is not supported: the pooling task served is embedding "
            "(task='embed', LLM.embed / LLM.encode / LLM.score)."
        )

    def reward(self, *args: Any, **kwargs: Any):
        """Upstream's ``reward`` (reward models): not served.

        Raises:
            ValueError: always; embeddings are the one pooling task here.
        """
        raise ValueError(
            "LLM.reward is not supported: the pooling task served is embedding "
            "(task='embed', LLM.embed / LLM.encode / LLM.score)."
        )


def _with_truncation(params, k: int):
    """``params`` (one PoolingParams or a sequence of them) with ``truncate_prompt_tokens=k``;
    anything else is left for the per-prompt type check."""
    if isinstance(params, PoolingParams):
        return dataclasses.replace(params, truncate_prompt_tokens=k)
    return [
        dataclasses.replace(p, truncate_prompt_tokens=k) if isinstance(p, PoolingParams) else p
        for p in params
    ]
