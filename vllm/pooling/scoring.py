"""Scoring text pairs with an embedding model, as upstream scores them for embedding models
(``LLM.score``, ``/score``, ``/rerank``): each text is embedded on its own and a pair's
score is the cosine similarity of its two vectors, in [-1, 1]. Cross-encoders (a model
that reads both texts of a pair in one prompt, upstream's ``--task score``) are not served.

Pairing rules (upstream's): with one first text and N second texts the pairs are
(first, second[i]) for each i (1-to-1 when N is 1, 1-to-N otherwise); with N first texts
there must be N second texts, and pair i is (first[i], second[i]) (N-to-N, as ``zip``).
A lone first text of a 1-to-N request is embedded once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm.outputs import PoolingRequestOutput, ScoringOutput, ScoringRequestOutput


class PairingError(ValueError):
    """A request whose texts cannot be paired; ``param`` names the field at fault."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def check_pairs(first: list, second: list, names: tuple[str, str] = ("text_1", "text_2")) -> int:
    """Check the pairing rules (module docstring) and return the number of pairs.

    Args:
        first: the first texts (or prompts) of the pairs, 1 or N of them.
        second: the second texts, N of them.
        names: the two fields' names, for the messages (``("query", "documents")`` for a
            rerank).
    Raises:
        PairingError: either list empty, or several first texts and not as many second
            ones (naming both counts).
    """
    for name, items in zip(names, (first, second)):
        if len(items) == 0:
            raise PairingError(f"{name} must hold at least one text, got an empty list.", name)
    if len(first) != 1 and len(first) != len(second):
        raise PairingError(
            f"{names[0]} has {len(first)} texts and {names[1]} has {len(second)}: pairs are "
            f"1-to-1, 1-to-N (one {names[0]}) or N-to-N (as many {names[0]} as {names[1]}).",
            names[0],
        )
    return len(second)


def cosine_scores(first: list[torch.Tensor], second: list[torch.Tensor]) -> list[float]:
    """Cosine similarity of each pair (module docstring): ``first`` holds 1 or N vectors,
    ``second`` N, each [hidden] (any float dtype; computed in float32). Returns N floats,
    score i for (first[0 or i], second[i])."""
    a = torch.stack([v.float() for v in first])  # [1 or N, hidden]
    b = torch.stack([v.float() for v in second])  # [N, hidden]
    return F.cosine_similarity(a, b, dim=1).tolist()  # [N]; a row of one broadcasts


def scoring_outputs(
    first: list[PoolingRequestOutput], second: list[PoolingRequestOutput]
) -> list[ScoringRequestOutput]:
    """``LLM.score``'s outputs from the pooled texts: ``first`` 1 or N, ``second`` N; one
    ScoringRequestOutput per pair with its cosine score and both texts' token ids."""
    scores = cosine_scores([o.outputs.data for o in first], [o.outputs.data for o in second])
    first = first * len(second) if len(first) == 1 else first
    return [
        ScoringRequestOutput(
            f"{a.request_id}_{b.request_id}",
            ScoringOutput(score),
            a.prompt_token_ids + b.prompt_token_ids,
            True,
        )  # fmt: skip
        for a, b, score in zip(first, second, scores)
    ]
