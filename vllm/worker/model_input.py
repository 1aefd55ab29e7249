"""Input preparation of one step: the scheduled groups flattened into a ForwardBatch.

Prefill rows feed every token of the sequence not already in the prefix cache (a row whose
first ``c`` tokens are cached feeds tokens ``c ..`` at positions ``c ..``; its seq_len stays
the full length, so the backend attends to the cached context through the block table), decode
rows their last token. With chunked prefill a prefill row feeds one chunk (``token_chunk_size``
tokens after ``computed_lens``; seq_len is where the chunk ends) and a step may mix prefill
rows (first) with decode rows: a MIXED batch (eager, or piecewise graphs). Padding to a
captured size is one step of it and works eagerly too (``ModelRunner.pad_eager_batches``,
a debug switch): a decode batch gets padded lanes up to a captured batch size, a prefill of
one sequence padded tokens up to a prefill-graph size. Padded lanes and tokens have token
0, position 0 and slot -1 (the scratch slot). A step planned as piecewise graphs pads its
token ids and positions only (token 0, position 0): its metadata covers the real tokens.
Whether the step replays a graph is the graph runner's
:class:`~vllm.cudagraph.runner.Plan`, recorded in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm.attention.backends.abstract import AttentionBackend, ForwardMode, StepInputs
from vllm.cudagraph.runner import GraphRunner
from vllm.model_executor.forward_batch import ForwardBatch
from vllm.model_executor.sampling_metadata import SamplingMetadata
from vllm.sampling_params import LOGPROBS_MODES
from vllm.sequence import SequenceGroupMetadata
from vllm.utils import pin_for, to_device

PAD_SLOT_ID = -1


@dataclass
class InputContext:
    """What input preparation needs from its ModelRunner.

    Attributes:
        block_size: tokens per KV block.
        device: where eager inputs go.
        attn_backend: builds an eager step's attention metadata.
        graph_runner: plans the step (pad, replay or eager).
        vocab_size: the model's vocabulary (sampling metadata).
        samples: this stage samples (the last PP stage).
        generators: per sequence id, its seeded generator (sampling metadata).
        pad_eager: pad eager steps like graphs (debug switch).
        seed_stream: the random stream of the generators (``stream_seed``; a draft
            model's runner draws another than the target's).
        logprobs_mode: what sampled positions' logprobs report (ModelConfig's).
    """

    block_size: int
    device: torch.device
    attn_backend: AttentionBackend
    graph_runner: GraphRunner
    vocab_size: int
    samples: bool
    generators: dict[int, torch.Generator]
    pad_eager: bool = False
    seed_stream: int = 0
    logprobs_mode: str = LOGPROBS_MODES[0]


def place_input(values: list[int], graph_size: int | None, device: torch.device) -> torch.Tensor:
    """An int64 model input [len(values)] (token ids or positions) where the step reads it:
    on ``device`` for an eager step (``graph_size`` None), in pinned host memory for a
    replay (which uploads it straight into the graph's static input buffer)."""
    host = torch.tensor(values, dtype=torch.long)
    if graph_size is None:
        return to_device(host, device)
    return pin_for(host, device)


def prefill_span(md: SequenceGroupMetadata, seq_id: int, n: int) -> tuple[int, int]:
    """Positions [start, end) that a prefill row of ``md`` computes for sequence ``seq_id``
    of ``n`` tokens: from its ``computed_lens`` (0 without) up to ``token_chunk_size`` more
    tokens, stopping at its end (every token past ``computed_lens`` without a chunk size).
    A sibling shorter than its group's chunk position (the chunks of an ``n > 1`` group
    follow its longest sequence, vllm/core/chunked_prefill.py) feeds its last token again:
    ``(n - 1, n)``. Not validated here (:func:`prepare_model_input` refuses empty spans)."""
    c = md.computed_lens.get(seq_id, 0) if md.computed_lens else 0
    if md.token_chunk_size is None:
        return c, n
    if c >= n:
        return n - 1, n
    return c, min(c + md.token_chunk_size, n)


def prepare_model_input(
    ctx: InputContext,
    seq_group_metadata_list: list[SequenceGroupMetadata],
    virtual_engine: int,
    scratch_slot: int,
    num_lookahead_slots: int = 0,
) -> ForwardBatch:
    """Flatten the scheduled groups into one :class:`ForwardBatch` for ``ctx``'s runner.

    Prefill rows feed every token of the sequence (prompt, plus outputs when a
    preempted sequence is recomputed) past its cached tokens (``computed_lens``), or the
    next ``token_chunk_size`` of them (a chunked prefill); decode rows feed the last token
    at position len - 1. Prefill groups come first; a list with decode groups after them
    is a MIXED batch (chunked prefill). A prefill with cached context never replays a
    prefill graph (captured for context-free prompts only); it and mixed steps may replay
    piecewise graphs (ids and positions padded to their token count). A decode
    batch may be padded with lanes up to a captured size; a prefill
    of one sequence with tokens (id 0, position 0, slot -1) up to a prefill-graph size
    (``StepInputs.graph_prefill``; sampling still reads its last real token).

    Raises:
        ValueError: an empty list, a prefill group after a decode group, or a prefill row
            that would compute nothing or run past its sequence (naming the counts).
    """
    if not seq_group_metadata_list:
        raise ValueError("prepare_model_input needs at least one scheduled group.")
    flags = [m.is_prompt for m in seq_group_metadata_list]
    num_prefill_groups = sum(flags)
    if any(flags[num_prefill_groups:]):
        raise ValueError(
            f"{num_prefill_groups} prefill groups are not all before the decode groups "
            "(a step lists prefill groups first)."
        )
    if num_prefill_groups == len(seq_group_metadata_list):
        mode = ForwardMode.PREFILL
    else:
        mode = ForwardMode.MIXED if num_prefill_groups else ForwardMode.DECODE
    is_prompt = mode == ForwardMode.PREFILL
    bs = ctx.block_size
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    seq_lens: list[int] = []
    query_lens: list[int] = []
    tables: list[list[int]] = []
    max_decode_len = 0
    has_context = False
    num_prefills = 0
    for md in seq_group_metadata_list:
        prompt_row = md.is_prompt
        for seq_id, data in md.seq_data.items():
            table = md.block_tables[seq_id]
            n = data.get_len()
            if prompt_row:
                c, end = prefill_span(md, seq_id, n)
                if not 0 <= c < end <= n:
                    raise ValueError(
                        f"sequence {seq_id}: a prefill of tokens {c}..{end - 1} of {n}; it "
                        "must compute at least one token and end within the sequence."
                    )
                has_context = has_context or c > 0
                input_ids.extend(data.get_token_ids()[c:end])
                positions.extend(range(c, end))
                slots.extend(table[p // bs] * bs + p % bs for p in range(c, end))
                query_lens.append(end - c)
                num_prefills += 1
                n = end  # the row's context once the chunk is written
            else:  # one token per row: no per-token lists
                p = n - 1
                input_ids.append(data.get_last_token_id())
                positions.append(p)
                slots.append(table[p // bs] * bs + p % bs)
                if n > max_decode_len:
                    max_decode_len = n
            seq_lens.append(n)
            tables.append(table)
    if mode == ForwardMode.DECODE:
        query_lens = [1] * len(seq_lens)
        max_decode_len += num_lookahead_slots
    elif mode == ForwardMode.MIXED:
        query_lens.extend([1] * (len(seq_lens) - num_prefills))
    real_rows = len(seq_lens)
    real_query_lens = list(query_lens)
    if is_prompt:
        batch_size = real_rows
        # prefill graphs attend among new tokens only: never with cached context
        plan = ctx.graph_runner.plan(
            virtual_engine, mode, real_rows, len(input_ids), 0, ctx.pad_eager, has_context
        )
        pad_to = 0 if plan.piecewise else plan.pad_to
        if pad_to:  # one row: padded tokens at its end, attending only among the row
            extra = pad_to - len(input_ids)
            input_ids.extend([0] * extra)
            positions.extend([0] * extra)
            slots.extend([PAD_SLOT_ID] * extra)
            seq_lens[0] = query_lens[0] = pad_to
    else:  # DECODE, or MIXED (padded only as pieces)
        plan = ctx.graph_runner.plan(
            virtual_engine, mode, real_rows, len(input_ids), max_decode_len, ctx.pad_eager
        )
        pad_to = 0  # a padded decode batch has lanes, not padded tokens
        batch_size = real_rows if plan.piecewise else plan.pad_to or real_rows
    graph_size = plan.graph_size
    for _ in range(batch_size - real_rows):  # padded lanes (decode only)
        input_ids.append(0)
        positions.append(0)
        slots.append(PAD_SLOT_ID)
        seq_lens.append(0)
        query_lens.append(1)
        tables.append([])
    step = StepInputs(mode, seq_lens, query_lens, tables, slots, real_rows, bool(pad_to),
                      num_prefills if mode == ForwardMode.MIXED else 0)  # fmt: skip
    attn_metadata = None  # a replayed graph refills its own captured metadata
    if graph_size is None or plan.piecewise:  # pieces: attention eager over the real tokens
        attn_metadata = ctx.attn_backend.build_metadata(step, scratch_slot)
    if plan.piecewise:  # token ids and positions only, up to the pieces' token count
        extra = plan.pad_to - len(input_ids)
        input_ids.extend([0] * extra)
        positions.extend([0] * extra)
    sm = None
    if ctx.samples:
        sm = SamplingMetadata.build(
            seq_group_metadata_list,
            real_query_lens,
            ctx.vocab_size,
            ctx.device,
            ctx.generators,
            ctx.seed_stream,
            ctx.logprobs_mode,
        )
    return ForwardBatch(
        mode=mode,
        input_ids=place_input(input_ids, graph_size, ctx.device),  # [batch_tokens]
        positions=place_input(positions, graph_size, ctx.device),  # [batch_tokens]
        attn_metadata=attn_metadata,
        step=step,
        sampling_metadata=sm,
        virtual_engine=virtual_engine,
        num_real_rows=real_rows,
        batch_size=batch_size,
        max_decode_seq_len=max_decode_len,
        graph_size=graph_size,
        eager_reason=plan.eager_reason,
        piecewise=plan.piecewise,
    )
