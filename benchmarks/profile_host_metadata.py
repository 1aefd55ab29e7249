"""Host time of the attention metadata builders for one decode step (CPU only).

Times, per decode step, FLASHINFER's ``paged_kv_host`` (eager plan, no width clip) and
``slot_rows_host`` plus TORCH_SDPA's ``decode_tables`` (graph width
``ceil(max_seq_len_to_capture / block_size)``) and ``_slots``, against the
list-based reference builders (``old_*`` below, element-by-element loops). Every case
checks first that both give identical tensors. Contexts are uniform in
``[--min-len, --max-len]``, tables are distinct random blocks, and a quarter of the rows
past the first carry lookahead blocks (speculative decoding), so the builders take their
general (selecting) path. Only one backend runs in a real step; the sum is what the host
budget (well under a ~1-2 ms GPU decode step) is measured against, and each part is also
reported. On a host with CUDA both FlashInfer builders pin their int32 tensors, as in
production (the vectorised one pins one buffer, the reference three). Example::

    python benchmarks/profile_host_metadata.py --batch-sizes 1 64 256

Prints the conditions, then one JSON line per batch size:
``{"bench": "host_metadata", "batch_size": ..., "old_us": ..., "new_us": ..., ...}``.
"""

from __future__ import annotations

import platform
import random
import statistics
import time

import numpy as np
import torch
from bench_common import emit, print_conditions

from vllm.attention.backends.abstract import ForwardMode, StepInputs
from vllm.attention.backends.flashinfer.paged_cache import paged_kv_host, slot_rows_host
from vllm.attention.backends.torch_sdpa import _slots, decode_tables
from vllm.utils import FlexibleArgumentParser

# ---- the list-based builders before vectorization (reference and "before" timing) ------


def old_paged_kv_host(step, block_size, scratch_block, width=None):
    indptr, indices, last = [0], [], []
    for n, table in zip(step.seq_lens, step.block_tables):
        if n <= 0:
            pages, tail = [scratch_block], 1
        else:
            need = -(-n // block_size)
            pages = list(table[: min(need, width) if width else need]) or [scratch_block] * need
            tail = n - (len(pages) - 1) * block_size
        indices.extend(pages)
        indptr.append(len(indices))
        last.append(tail)
    return tuple(old_host_i32(v) for v in (indptr, indices, last))


def old_host_i32(values):
    t = torch.tensor(values, dtype=torch.int32)
    return t.pin_memory() if torch.cuda.is_available() else t


def old_slot_rows_host(slots, scratch_slot, block_size):
    fixed = [scratch_slot if s < 0 else s for s in slots]
    k_rows = [s + (s // block_size) * block_size for s in fixed]
    return torch.tensor([fixed, k_rows, [r + block_size for r in k_rows]], dtype=torch.long)


def old_decode_tables(step, width, scratch_block):
    table = torch.full((len(step.seq_lens), width), scratch_block, dtype=torch.long)
    for i, blocks in enumerate(step.block_tables):
        if blocks:
            n = min(len(blocks), width)
            table[i, :n] = torch.tensor(blocks[:n], dtype=torch.long)
    lens = torch.tensor([max(1, n) for n in step.seq_lens], dtype=torch.long)
    return table, lens


def old_slots(step, scratch_slot):
    slots = torch.tensor(step.slot_mapping, dtype=torch.long)
    return torch.where(slots < 0, scratch_slot, slots)


# ---- the benchmark ------------------------------------------------------------------------


def decode_step(batch: int, lo: int, hi: int, block_size: int, seed: int) -> StepInputs:
    """A decode step of ``batch`` rows with contexts uniform in [lo, hi]."""
    rng = random.Random(seed)
    lens = [rng.randint(lo, hi) for _ in range(batch)]
    needs = [-(-n // block_size) + (2 if i % 4 == 3 else 0) for i, n in enumerate(lens)]
    pool = list(range(sum(needs)))
    rng.shuffle(pool)
    tables, at = [], 0
    for k in needs:
        tables.append(pool[at : at + k])
        at += k
    slots = [
        t[(n - 1) // block_size] * block_size + (n - 1) % block_size for n, t in zip(lens, tables)
    ]
    return StepInputs(ForwardMode.DECODE, lens, [1] * batch, tables, slots, batch)


def builders(step: StepInputs, bs: int, width: int, scratch_block: int) -> dict:
    """Per builder, the (old, new) zero-argument calls for ``step``."""
    scratch_slot = scratch_block * bs
    return {
        "paged_kv_host": (
            lambda: old_paged_kv_host(step, bs, scratch_block),
            lambda: paged_kv_host(step, bs, scratch_block),
        ),
        "slot_rows_host": (
            lambda: old_slot_rows_host(step.slot_mapping, scratch_slot, bs),
            lambda: slot_rows_host(step.slot_mapping, scratch_slot, bs),
        ),
        "decode_tables": (
            lambda: old_decode_tables(step, width, scratch_block),
            lambda: decode_tables(step, width, scratch_block),
        ),
        "sdpa_slots": (
            lambda: old_slots(step, scratch_slot),
            lambda: _slots(step, scratch_slot),
        ),
    }


def time_us(fn, reps: int) -> float:
    """Median wall time of ``fn()`` in microseconds over ``reps`` calls (after 3 warm-ups)."""
    for _ in range(3):
        fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


def main() -> None:
    p = FlexibleArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64, 256])
    p.add_argument("--min-len", type=int, default=100)
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-seq-len-to-capture", type=int, default=8192)
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-json", default=None, help="Append the JSON lines to this file.")
    args = p.parse_args()
    torch.set_num_threads(1)
    bs = args.block_size
    width = -(-args.max_seq_len_to_capture // bs)
    scratch_block = 1 << 20  # index num_blocks; the tables use blocks below it
    print_conditions(
        "host metadata builders (one decode step)",
        {
            "cpu": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "torch / numpy": f"{torch.__version__} / {np.__version__}",
            "threads": torch.get_num_threads(),
            "contexts": f"uniform in [{args.min_len}, {args.max_len}] tokens",
            "block_size": bs,
            "sdpa table width": f"{width} blocks (max_seq_len_to_capture "
            f"{args.max_seq_len_to_capture})",
            "lookahead": "2 extra blocks on every 4th row",
            "timing": f"median of {args.reps} calls after 3 warm-ups",
        },
    )
    for batch in args.batch_sizes:
        step = decode_step(batch, args.min_len, args.max_len, bs, args.seed + batch)
        parts = builders(step, bs, width, scratch_block)
        record = {"bench": "host_metadata", "batch_size": batch, "block_size": bs}
        record["pages"] = sum(-(-n // bs) for n in step.seq_lens)
        old_total = new_total = 0.0
        for name, (old, new) in parts.items():
            want, got = old(), new()
            want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
            for x, y in zip(want, got):
                assert x.dtype == y.dtype and torch.equal(x, y), f"{name} differs at {batch}"
            o, n = time_us(old, args.reps), time_us(new, args.reps)
            record[f"{name}_old_us"], record[f"{name}_new_us"] = round(o, 1), round(n, 1)
            old_total += o
            new_total += n
        record["old_us"], record["new_us"] = round(old_total, 1), round(new_total, 1)
        record["speedup"] = round(old_total / new_total, 2)
        emit(record, args.output_json)


if __name__ == "__main__":
    main()
