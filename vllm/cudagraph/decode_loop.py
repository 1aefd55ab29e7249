"""Decode-loop graphs: multi-step decoding with the host out of the per-token loop.

Why: at one to a few sequences a decode step of a small model takes under a millisecond
on the GPU, and multi-step decoding (vllm/worker/multi_step.py) still spends about as long
on the host per token: building the next step's metadata, planning attention, launching
the logits and sampler kernels one by one. A decode-loop graph captures one *whole* step:
the forward pass, the logits, greedy sampling, writing the step's packed sample rows into
a ring buffer, feeding the sampled ids back as the next input ids, and advancing the
positions and the attention metadata by one token (``AttentionGraphState.advance``). The
host uploads a call's step-0 inputs once, replays the graph ``n`` times back to back and
reads the ring once.

Scope (everything else takes the per-step multi-step path, same results):
- decode batches whose padded size is a captured size of at most the attention backend's
  ``loop_max_rows()`` rows (TORCH_SDPA: 8; FLASHINFER: every size with tensor-core decode
  and no sliding window, else its small-decode limit, 1 by default), one loop graph per
  such size, padded lanes as in plain graphs: they write only the scratch block and their
  samples are dropped;
- greedy sampling without penalties, seeds or logprobs, in a "_logprobs" mode
  (``eligible``); the packed rows are
  those of ``Sampler.sample_on_device`` (token id, logprob, rank 1), computed from the
  logits of every lane as ``ModelRunner.compute_logits`` does for a graph's padded batch,
  except that the lm_head's logits stay in the model's dtype for the greedy kernel
  (vllm/kernels/greedy.py widens them as it reads them): a loop graph, a plain graph and
  an eager step on the same padded batch sample the same ids, and their logprobs agree to
  float32 rounding;
- attention backends whose graph state ``advances_on_device`` at that size (TORCH_SDPA;
  FLASHINFER's small-decode sizes, and its wrappers when planned once per call:
  vllm/attention/backends/flashinfer/loop_plan.py; the state's ``prepare_loop`` stages
  a call), PP = 1, graphs on and ``num_scheduler_steps > 1``;
- the step's context, lookahead slots included, fits ``max_seq_len_to_capture`` (the same
  gate as plain graphs), and the scheduler reserved the lookahead blocks, so the slots the
  graph derives from the block table exist.
``CompilationConfig.disable_decode_loop_graphs`` (``--disable-decode-loop-graphs``) turns
them off (the plain multi-step path then runs). Each replay counts as one replayed step of
its size (docs/design.md, guarantee 5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vllm.attention.backends.abstract import AttentionGraphState, StepInputs
from vllm.cudagraph.capture import GraphCapturer
from vllm.kernels.dispatch import get_triton_decode_step
from vllm.model_executor.layers.sampler import Sampler
from vllm.model_executor.sampling_metadata import SamplingMetadata

PACKED_WIDTH = 3  # token id, logprob, rank (Sampler._pack_logprobs with k = 0)


def eligible(sm: SamplingMetadata) -> bool:
    """Whether a decode batch's sampling fits a loop graph: greedy, no penalties,
    min_tokens, logit_bias or allowed_token_ids, no logprobs, one sample row per sequence,
    and a "_logprobs" ``logprobs_mode`` (the graph's static metadata reports the sampled
    token's log-probability, raw and processed being the same for such rows)."""
    return (
        sm.all_greedy
        and sm.penalties is None
        and sm.logit_bias is None
        and sm.logprobs_mode.endswith("_logprobs")
        and sm.max_logprobs == 0
        and sm.prompt_row_ids is None
        and not any(g is not None for g in sm.generators)
    )


def greedy_metadata(rows: int, device: torch.device) -> SamplingMetadata:
    """The static SamplingMetadata a loop graph samples with: ``rows`` greedy rows in order
    (padded lanes included; their samples are dropped)."""
    return SamplingMetadata(
        groups=[],
        selected_token_indices=torch.arange(rows, device=device),
        sample_row_ids=torch.arange(rows, device=device),
        all_greedy=True,
    )


@dataclass
class LoopGraph:
    """One captured decode-loop graph of one virtual engine.

    Attributes:
        rows: the captured size (padded lanes included).
        graph: the graph object (``replay()`` runs one step).
        ring: [max_steps, rows, PACKED_WIDTH] float64, step i's packed sample rows.
        counter: [1] int64, the ring row the next replay writes (zeroed per call).
        attn_metadata: the metadata it was captured with (its buffers are the VE's).
    """

    rows: int
    graph: Any
    ring: torch.Tensor
    counter: torch.Tensor
    attn_metadata: Any


def capture_loop_graph(
    model: torch.nn.Module,
    sampler: Sampler,
    state: AttentionGraphState,
    ids: torch.Tensor,
    pos: torch.Tensor,
    kv_caches: list[torch.Tensor],
    max_steps: int,
    capturer: GraphCapturer,
    pool: Any,
) -> LoopGraph | None:
    """Capture the loop graph of ``ids.shape[0]`` rows over one VE's graph ``state`` and
    static inputs ``ids`` / ``pos`` ([rows] int64 views); None when the attention backend
    cannot advance that size on the device. Warm-up and capture run with every lane on the
    scratch block, as plain captures do."""
    rows = int(ids.shape[0])
    device = ids.device
    md = state.metadata_for_capture(rows)
    if not state.advances_on_device(md):
        return None
    ring = torch.zeros(max_steps, rows, PACKED_WIDTH, dtype=torch.float64, device=device)
    counter = torch.zeros(1, dtype=torch.long, device=device)
    sm = greedy_metadata(rows, device)
    idle = StepInputs.padded_decode(rows)
    kernels = get_triton_decode_step(ids)

    def reset():  # every lane idle on the scratch block, the ring at row 0
        pos.zero_()
        counter.zero_()
        state.prepare_replay(rows, idle, md)

    def step():
        hidden = model(ids, pos, kv_caches, md, None)  # [rows, hidden]
        logits = model.compute_logits(hidden, float32=False)  # [rows, vocab], model dtype
        nxt, packed, _ = sampler.sample_on_device(logits, sm)  # [rows], [rows, 3]
        if kernels is not None:  # the four lines below in one launch
            kernels.finish_step(ring, counter, packed, ids, nxt.contiguous(), pos)
        else:
            ring.index_copy_(0, counter, packed[None])  # ring[counter] = packed
            counter.add_(1)
            ids.copy_(nxt)
            pos.add_(1)
        state.advance(md, pos)

    for _ in range(2):  # warm-up, from the idle state each time (scratch block only)
        reset()
        step()
    reset()
    capturer.synchronize()
    graph, _ = capturer.capture(step, pool)
    return LoopGraph(rows=rows, graph=graph, ring=ring, counter=counter, attn_metadata=md)
