"""Input preparation of one step: the scheduled groups flattened into a ForwardBatch.

Prefill rows feed every token of the sequence, decode rows their last token. Padding to a
captured size is one step of it and works eagerly too (``ModelRunner.pad_eager_batches``,
a debug switch): a decode batch gets padded lanes up to a captured batch size, a prefill of
one sequence padded tokens up to a prefill-graph size. Padded lanes and tokens have token
0, position 0 and slot -1 (the scratch slot). Whether the step replays a graph is decided
here (the graph runner's gates) and recorded in the batch.
"""

from __future__ import annotations

from vllm.attention.backends.abstract import ForwardMode, StepInputs
from vllm.model_executor.sampling_metadata import SamplingMetadata
from vllm.sequence import SequenceGroupMetadata
from vllm.worker.cuda_graph_sizes import next_size
from vllm.worker.forward_batch import ForwardBatch

PAD_SLOT_ID = -1


def plan_rows(
    runner, virtual_engine: int, rows: int, max_decode_len: int
) -> tuple[int, int | None, str | None]:
    """(padded rows, graph size or None, eager reason or None) for a decode step of
    ``runner`` (a ModelRunner)."""
    if runner.graph_runner is None:
        padded = runner.capture_sizes.padded_size(rows) if runner.pad_eager_batches else None
        return padded or rows, None, "enforce_eager"
    gate = runner.graph_runner
    reason = gate.eager_reason(virtual_engine, ForwardMode.DECODE, rows, max_decode_len)
    if reason is None:
        size = gate.padded_size(rows)
        return size, size, None
    return rows, None, reason


def plan_prefill(
    runner, virtual_engine: int, rows: int, tokens: int
) -> tuple[int | None, str | None, int]:
    """(graph size or None, eager reason or None, tokens to pad to or 0) of a prefill
    of ``rows`` sequences and ``tokens`` tokens: a prefill graph when one was captured
    for it (one sequence, see ``GraphRunner.prefill_graph_size``), else eager, padded
    like a graph only under the eager debug switch ``pad_eager_batches``."""
    if runner.graph_runner is not None:
        size = runner.graph_runner.prefill_graph_size(virtual_engine, rows, tokens)
        if size is not None:
            return size, None, size
    elif runner.pad_eager_batches and rows == 1:
        size = next_size(runner.prefill_sizes, tokens)
        if size is not None:
            return None, "prefill", size
    return None, "prefill", 0


def prepare_model_input(
    runner,
    seq_group_metadata_list: list[SequenceGroupMetadata],
    virtual_engine: int,
    scratch_slot: int,
    num_lookahead_slots: int = 0,
) -> ForwardBatch:
    """Flatten the scheduled groups into one :class:`ForwardBatch`.

    Prefill rows feed every token of the sequence (prompt, plus outputs when a
    preempted sequence is recomputed); decode rows feed the last token at position
    len - 1. A decode batch may be padded with lanes up to a captured size; a prefill
    of one sequence with tokens (id 0, position 0, slot -1) up to a prefill-graph size
    (``StepInputs.graph_prefill``; sampling still reads its last real token). Raises
    ValueError on a mixed prefill/decode list (never scheduled).
    """
    if not seq_group_metadata_list:
        raise ValueError("prepare_model_input needs at least one scheduled group.")
    is_prompt = seq_group_metadata_list[0].is_prompt
    if any(m.is_prompt != is_prompt for m in seq_group_metadata_list):
        raise ValueError("a step mixes prefill and decode groups (chunked prefill is off).")
    mode = ForwardMode.PREFILL if is_prompt else ForwardMode.DECODE
    bs = runner.block_size
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    seq_lens: list[int] = []
    query_lens: list[int] = []
    tables: list[list[int]] = []
    max_decode_len = 0
    for md in seq_group_metadata_list:
        for seq_id, data in md.seq_data.items():
            table = md.block_tables[seq_id]
            n = data.get_len()
            if is_prompt:
                input_ids.extend(data.get_token_ids())
                positions.extend(range(n))
                slots.extend(table[p // bs] * bs + p % bs for p in range(n))
                query_lens.append(n)
            else:  # one token per row: no per-token lists
                p = n - 1
                input_ids.append(data.get_last_token_id())
                positions.append(p)
                slots.append(table[p // bs] * bs + p % bs)
                if n > max_decode_len:
                    max_decode_len = n
            seq_lens.append(n)
            tables.append(table)
    if not is_prompt:
        query_lens = [1] * len(seq_lens)
        max_decode_len += num_lookahead_slots
    real_rows = len(seq_lens)
    real_query_lens = list(query_lens)
    if is_prompt:
        batch_size = real_rows
        graph_size, eager_reason, pad_to = plan_prefill(
            runner, virtual_engine, real_rows, len(input_ids)
        )
        if pad_to:  # one row: padded tokens at its end, attending only among the row
            extra = pad_to - len(input_ids)
            input_ids.extend([0] * extra)
            positions.extend([0] * extra)
            slots.extend([PAD_SLOT_ID] * extra)
            seq_lens[0] = query_lens[0] = pad_to
    else:
        pad_to = 0
        batch_size, graph_size, eager_reason = plan_rows(
            runner, virtual_engine, real_rows, max_decode_len
        )
    for _ in range(batch_size - real_rows):  # padded lanes (decode only)
        input_ids.append(0)
        positions.append(0)
        slots.append(PAD_SLOT_ID)
        seq_lens.append(0)
        query_lens.append(1)
        tables.append([])
    step = StepInputs(mode, seq_lens, query_lens, tables, slots, real_rows, bool(pad_to))
    attn_metadata = None  # a replayed graph refills its own captured metadata
    if graph_size is None:
        attn_metadata = runner.attn_backend.build_metadata(step, scratch_slot)
    sm = None
    if runner.is_last_stage:
        sm = SamplingMetadata.build(
            seq_group_metadata_list,
            real_query_lens,
            runner.model_config.vocab_size,
            runner.device,
            runner.generators,
        )
    return ForwardBatch(
        mode=mode,
        input_ids=runner.place_input(input_ids, graph_size),  # [batch_tokens]
        positions=runner.place_input(positions, graph_size),  # [batch_tokens]
        attn_metadata=attn_metadata,
        step=step,
        sampling_metadata=sm,
        virtual_engine=virtual_engine,
        num_real_rows=real_rows,
        batch_size=batch_size,
        max_decode_seq_len=max_decode_len,
        graph_size=graph_size,
        eager_reason=eager_reason,
    )
