"""Group-limited top-k routing of the DeepSeek-style routers (GLM-4.5, DeepSeek-V2 / V3).

:func:`grouped_topk`, over sigmoid scores with a selection bias: the router of
transformers' ``Glm4MoeTopkRouter`` and ``DeepseekV3TopkRouter`` (DeepSeek-V3's "noaux_tc"
routing), for router logits ``l = x @ gate.T`` computed in float32:

1. ``s = sigmoid(l)``, the expert scores [T, E];
2. ``c = s + e_score_correction_bias``, the scores that choose (the bias is a learned load
   balancing offset: it changes which experts are picked, never their weights);
3. the E experts form ``n_group`` equal groups; a group's score is the sum of its two
   largest ``c``; only the ``topk_group`` best groups stay eligible;
4. the ``top_k`` largest ``c`` among the eligible experts are picked;
5. their weights are the unbiased ``s`` of those experts, divided by their sum (plus 1e-20)
   when ``norm_topk_prob``, then times ``routed_scaling_factor``.

Every step uses transformers' operations in the same order (``topk`` with ``sorted=False``
included), so float32 indices and weights are identical to it.

:func:`softmax_group_topk`, over softmax scores: the router of transformers'
``DeepseekV2TopkRouter``. ``s = softmax(l)`` in float32; with ``topk_method="greedy"`` the
``top_k`` largest ``s`` are picked; with ``"group_limited_greedy"`` a group's score is its
largest ``s``, the other groups' scores are set to 0 and the ``top_k`` largest of the rest
are picked. The weights are the picked ``s`` times ``routed_scaling_factor``, never
renormalised (transformers' V2 router ignores ``norm_topk_prob``).

Either way the expert outputs are then summed by
:meth:`vllm.model_executor.layers.fused_moe.FusedMoE.forward_routed`.
"""

import torch


def check_expert_groups(num_experts: int, num_groups, topk_groups) -> None:
    """Refuse a group layout either router cannot use.

    Raises:
        ValueError: ``n_group`` not a positive int dividing the experts, or ``topk_group``
            not an int in [1, n_group] (None included); the message names the values.
    """
    if not isinstance(num_groups, int) or num_groups < 1 or num_experts % num_groups:
        raise ValueError(
            f"n_group={num_groups!r} must be positive and divide n_routed_experts={num_experts}"
        )
    if not isinstance(topk_groups, int) or not 1 <= topk_groups <= num_groups:
        raise ValueError(f"topk_group={topk_groups!r} must be in [1, n_group={num_groups}]")


def check_grouped_topk(num_experts: int, top_k: int, num_groups, topk_groups) -> None:
    """Refuse a routing :func:`grouped_topk` cannot run.

    Raises:
        ValueError: a group layout :func:`check_expert_groups` refuses, groups of fewer
            than 2 experts (a group's score sums its best two), or ``top_k`` above the
            experts of the eligible groups; the message names the values.
    """
    check_expert_groups(num_experts, num_groups, topk_groups)
    if num_experts // num_groups < 2:
        raise ValueError(
            f"n_routed_experts={num_experts} / n_group={num_groups} leaves fewer than 2 experts "
            "per group (a group scores by its two best experts)"
        )
    eligible = topk_groups * (num_experts // num_groups)
    if not 1 <= top_k <= eligible:
        raise ValueError(
            f"num_experts_per_tok={top_k} must be in [1, {eligible}] (the experts of "
            f"topk_group={topk_groups} groups of {num_experts // num_groups})"
        )


def _top_groups_mask(group_scores: torch.Tensor, topk_groups: int, per_group: int) -> torch.Tensor:
    """group_scores [T, G] -> bool [T, G * per_group]: True for the experts of each token's
    ``topk_groups`` best groups (``topk`` with ``sorted=False``, as transformers' routers)."""
    num_tokens, num_groups = group_scores.shape
    group_ids = torch.topk(group_scores, k=topk_groups, dim=-1, sorted=False)[1]  # [T, topk_g]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_ids, 1)  # [T, G]
    return (
        group_mask.unsqueeze(-1)
        .expand(num_tokens, num_groups, per_group)
        .reshape(num_tokens, -1)
        .bool()
    )  # [T, E]


def grouped_topk(
    router_logits: torch.Tensor,
    correction_bias: torch.Tensor,
    top_k: int,
    num_groups: int,
    topk_groups: int,
    renormalize: bool,
    scaling_factor: float,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Route tokens as the module docstring says.

    Args:
        router_logits: [T, E] float32.
        correction_bias: [E] float32, ``e_score_correction_bias``.
        top_k: experts per token (``num_experts_per_tok``).
        num_groups, topk_groups: ``n_group`` and ``topk_group``.
        renormalize: ``norm_topk_prob``.
        scaling_factor: ``routed_scaling_factor``.
        dtype: the dtype of the returned weights (the hidden states').
    Returns:
        (weights [T, top_k] in ``dtype``, expert ids [T, top_k] int64), in ``topk``'s
        unsorted order.
    """
    num_tokens, num_experts = router_logits.shape
    per_group = num_experts // num_groups
    scores = router_logits.sigmoid()  # [T, E]
    choice = scores + correction_bias  # [T, E]
    group_scores = (
        choice.view(num_tokens, num_groups, per_group).topk(2, dim=-1)[0].sum(dim=-1)
    )  # [T, G]
    expert_mask = _top_groups_mask(group_scores, topk_groups, per_group)  # [T, E]
    choice = choice.masked_fill(~expert_mask, float("-inf"))  # [T, E]
    ids = torch.topk(choice, k=top_k, dim=-1, sorted=False)[1]  # [T, top_k]
    weights = scores.gather(1, ids)  # [T, top_k]
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    weights = weights * scaling_factor  # [T, top_k]
    return weights.to(dtype), ids


def softmax_group_topk(
    router_logits: torch.Tensor,
    top_k: int,
    num_groups: int | None,
    topk_groups: int | None,
    scaling_factor: float,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V2's softmax routing (module docstring).

    Args:
        router_logits: [T, E] float32.
        top_k: experts per token (``num_experts_per_tok``).
        num_groups, topk_groups: ``n_group`` and ``topk_group`` for
            ``group_limited_greedy``; None for ``greedy`` (every expert eligible).
        scaling_factor: ``routed_scaling_factor``.
        dtype: the dtype of the returned weights (the hidden states').
    Returns:
        (weights [T, top_k] in ``dtype``, expert ids [T, top_k] int64), in ``topk``'s
        unsorted order.
    """
    num_tokens, num_experts = router_logits.shape
    scores = router_logits.softmax(dim=-1, dtype=torch.float32)  # [T, E]
    if num_groups is not None:
        per_group = num_experts // num_groups
        group_scores = scores.view(num_tokens, num_groups, per_group).max(dim=-1).values  # [T, G]
        expert_mask = _top_groups_mask(group_scores, topk_groups, per_group)  # [T, E]
        scores = scores.masked_fill(~expert_mask, 0.0)  # [T, E]
    weights, ids = torch.topk(scores, k=top_k, dim=-1, sorted=False)  # [T, top_k] each
    weights = weights * scaling_factor  # [T, top_k]
    return weights.to(dtype), ids


__all__ = ["check_expert_groups", "check_grouped_topk", "grouped_topk", "softmax_group_topk"]
