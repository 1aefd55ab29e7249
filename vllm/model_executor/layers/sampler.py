"""The sampler: logits -> next tokens and logprobs, with no host sync until the end.

Order of operations (upstream vLLM's): penalties on the raw logits, logprobs from the
penalized logits (log_softmax, float32), then for random rows temperature, top-k, top-p and
min-p filtering and sampling by the exponential race: ``argmax(probs / q)`` with
``q ~ Exp(1)`` picks index i with probability probs[i] (Gumbel-max trick in another form);
seeded rows draw q from their own generator, so their tokens do not depend on the batch.
The only host transfer is the final copy of sampled ids (and requested logprobs).
"""

from __future__ import annotations

import torch

from vllm.model_executor.sampling_metadata import SamplingMetadata
from vllm.sequence import (
    CompletionSequenceGroupOutput,
    Logprob,
    PositionLogprobs,
    SamplerOutput,
    SequenceOutput,
)


def apply_penalties(logits: torch.Tensor, sm: SamplingMetadata) -> torch.Tensor:
    """Presence/frequency (OpenAI definition, output tokens only) and repetition (CTRL,
    arXiv:1909.05858: prompt and output tokens) penalties.

    logits: [num_samples, vocab] float32, modified in place and returned.
    """
    vocab = logits.shape[1]
    device = logits.device
    for row, group_params in enumerate(_row_params(sm)):
        p = group_params
        if p.presence_penalty == 0 and p.frequency_penalty == 0 and p.repetition_penalty == 1:
            continue
        out_ids = torch.tensor(sm.output_token_ids[row], dtype=torch.long, device=device)
        counts = torch.bincount(out_ids, minlength=vocab)[:vocab].to(logits.dtype)  # [vocab]
        if p.repetition_penalty != 1.0:
            seen = counts > 0
            prompt = torch.tensor(sm.prompt_token_ids[row], dtype=torch.long, device=device)
            seen[prompt] = True
            x = logits[row]
            penalized = torch.where(x > 0, x / p.repetition_penalty, x * p.repetition_penalty)
            logits[row] = torch.where(seen, penalized, x)
        logits[row] -= p.frequency_penalty * counts
        logits[row] -= p.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def _row_params(sm: SamplingMetadata):
    for g in sm.groups:
        for _ in g.sample_rows:
            yield g.params


def _filter(logits: torch.Tensor, sm: SamplingMetadata) -> torch.Tensor:
    """Temperature, top-k, top-p, min-p; logits [num_samples, vocab] -> probs (float32)."""
    logits = logits / sm.temperature[:, None]
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)  # [num_samples, vocab]
    vocab = logits.shape[1]
    ranks = torch.arange(vocab, device=logits.device)[None, :]  # [1, vocab]
    drop = ranks >= sm.top_k[:, None]  # top-k: keep the k best
    probs_sorted = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    cum = probs_sorted.cumsum(dim=-1)
    drop |= (cum - probs_sorted) >= sm.top_p[:, None]  # top-p: keep the smallest prefix
    drop |= probs_sorted < (sm.min_p[:, None] * probs_sorted[:, :1])  # min-p vs the top prob
    drop[:, 0] = False  # the most likely token always survives
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    filtered = torch.empty_like(logits).scatter_(1, sorted_idx, sorted_logits)
    return filtered.softmax(dim=-1)  # [num_samples, vocab]


def _sample_random(probs: torch.Tensor, sm: SamplingMetadata) -> torch.Tensor:
    """Exponential-race sampling; probs [num_samples, vocab] -> ids [num_samples] int64."""
    q = torch.empty_like(probs)
    q.exponential_()
    for row, gen in enumerate(sm.generators):
        if gen is not None:
            q[row].exponential_(generator=gen)
    return (probs / q).argmax(dim=-1)


class Sampler(torch.nn.Module):
    """Turns the selected rows' logits into a :class:`SamplerOutput`."""

    def forward(self, logits: torch.Tensor, sm: SamplingMetadata) -> SamplerOutput:
        """Sample one token per sequence.

        Args:
            logits: [num_rows, vocab] float32, rows laid out by ``sm`` (sample rows and
                prompt-logprob rows).
        Returns:
            SamplerOutput with one CompletionSequenceGroupOutput per group; each sample
            carries the chosen token's logprob and rank plus the top ``logprobs`` entries.
        """
        sample_logits = logits[sm.sample_row_ids]  # [num_samples, vocab]
        if sm.do_penalties:
            sample_logits = apply_penalties(sample_logits.clone(), sm)
        greedy_ids = sample_logits.argmax(dim=-1)  # [num_samples]
        if sm.all_greedy:
            ids = greedy_ids
        else:
            random_ids = _sample_random(_filter(sample_logits, sm), sm)
            ids = torch.where(sm.greedy_mask, greedy_ids, random_ids)
        logprobs = torch.log_softmax(sample_logits, dim=-1)  # [num_samples, vocab]
        chosen_lp = logprobs.gather(1, ids[:, None])[:, 0]  # [num_samples]
        ranks = (logprobs > chosen_lp[:, None]).sum(dim=-1) + 1  # [num_samples]
        k = sm.max_logprobs
        top_lp = top_ids = None
        if k > 0:
            top_lp, top_ids = logprobs.topk(k, dim=-1)  # [num_samples, k]
            top_lp, top_ids = top_lp.tolist(), top_ids.tolist()
        ids_host = ids.tolist()  # the one host sync of the step
        lp_host, rank_host = chosen_lp.tolist(), ranks.tolist()
        prompt_lp = _prompt_logprobs(logits, sm)
        outputs: list[CompletionSequenceGroupOutput] = []
        row = 0
        for gi, g in enumerate(sm.groups):
            samples = []
            for seq_id in g.seq_ids:
                tok = ids_host[row]
                pos: PositionLogprobs = {tok: Logprob(lp_host[row], rank_host[row])}
                n = g.params.logprobs or 0
                for j in range(n):
                    t = top_ids[row][j]
                    if t not in pos:
                        pos[t] = Logprob(top_lp[row][j], j + 1)
                samples.append(SequenceOutput(seq_id, tok, pos))
                row += 1
            outputs.append(CompletionSequenceGroupOutput(samples, prompt_lp.get(gi)))
        return SamplerOutput(outputs=outputs, sampled_token_ids=ids)


def _prompt_logprobs(
    logits: torch.Tensor, sm: SamplingMetadata
) -> dict[int, list[PositionLogprobs | None]]:
    """Prompt logprobs per group index: None for position 0, then for each prompt token
    its logprob (and rank) given the previous tokens plus the top ``prompt_logprobs``."""
    result: dict[int, list[PositionLogprobs | None]] = {}
    for gi, g in enumerate(sm.groups):
        if not g.prompt_rows:
            continue
        rows = torch.tensor(g.prompt_rows, dtype=torch.long, device=logits.device)
        lp = torch.log_softmax(logits[rows], dim=-1)  # [prompt_len - 1, vocab]
        targets = torch.tensor(g.prompt_token_ids[1:], dtype=torch.long, device=logits.device)
        tgt_lp = lp.gather(1, targets[:, None])[:, 0]
        ranks = ((lp > tgt_lp[:, None]).sum(dim=-1) + 1).tolist()
        k = g.params.prompt_logprobs or 0
        top_lp, top_ids = lp.topk(k, dim=-1) if k else (None, None)
        tgt_lp = tgt_lp.tolist()
        entries: list[PositionLogprobs | None] = [None]
        for i, t in enumerate(g.prompt_token_ids[1:]):
            pos = {t: Logprob(tgt_lp[i], ranks[i])}
            for j in range(k):
                tid = int(top_ids[i, j])
                if tid not in pos:
                    pos[tid] = Logprob(float(top_lp[i, j]), j + 1)
            entries.append(pos)
        result[gi] = entries
    return result
