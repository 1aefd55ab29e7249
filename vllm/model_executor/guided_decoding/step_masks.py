"""One step's token bitmasks, filled when the sampler first needs them.

The engine attaches a :class:`StepMasks` (the step's constrained sequences and their
grammar matchers) to the scheduled groups instead of filled masks. In the engine's own
process (the single-GPU executor) the sampler reads it after the forward pass has been
launched, so the matchers fill their masks on the host while the device computes the
logits: one multi-threaded xgrammar call writes every row straight into a reused pinned
buffer, and one asynchronous copy moves it to the device. Sent to another process (the
multi-process and Ray executors pickle the step), it fills at once and travels as
:class:`PackedMasks`, plain bytes per sequence.

Rows are xgrammar's packed layout (vllm/model_executor/guided_decoding/bitmask.py): one
int32 word per 32 vocabulary ids, ``ceil(vocab / 32)`` words per row.
"""

from __future__ import annotations

from typing import Any

import torch

from vllm.model_executor.guided_decoding.bitmask import words_per_row


class _MaskSource:
    """What :class:`PendingBitmask` reads rows from: a mapping keyed by seq_id
    (``by_seq``: a grammar matcher, or a filled row; None for a sequence still reasoning,
    whose grammar has not started) and a ``fill(seq_ids, out, rows)`` method.

    A source is true while it has any sequence, reasoning ones included: the step must
    run one decode pass. Only sequences with a row are ``in`` it (get a masked row)."""

    def __init__(self, by_seq: dict[int, Any]):
        self.by_seq = by_seq

    def __contains__(self, seq_id: int) -> bool:
        return self.by_seq.get(seq_id) is not None

    def __bool__(self) -> bool:
        return bool(self.by_seq)


class StepMasks(_MaskSource):
    """The live matchers of one step's constrained sequences (engine process).

    Args:
        matchers: seq_id -> xgrammar ``GrammarMatcher`` in the state before this step
            (None: the sequence is still reasoning, no row).
        vocab_size: the logits width the masks cover.
        batch: an xgrammar ``BatchGrammarMatcher`` (its thread pool fills rows in parallel).

    Reading a row after the matcher accepted this step's token would give the next step's
    mask: the engine only advances matchers in output processing, after the step.
    """

    def __init__(self, matchers: dict[int, Any], vocab_size: int, batch: Any):
        super().__init__(matchers)
        self.vocab_size = vocab_size
        self._batch = batch

    def fill(self, seq_ids: list[int], out: torch.Tensor, rows: list[int]) -> None:
        """Write the mask of ``seq_ids[i]`` into row ``rows[i]`` of ``out`` ([n, words]
        int32 on the CPU, pinned or not)."""
        self._batch.batch_fill_next_token_bitmask(
            [self.by_seq[s] for s in seq_ids], out, indices=rows
        )

    def packed(self) -> dict[int, bytes | None]:
        """seq_id -> its row as bytes (``words`` little-endian int32), None for a
        sequence still reasoning."""
        ids = [s for s in self.by_seq if s in self]
        out = torch.empty((len(ids), words_per_row(self.vocab_size)), dtype=torch.int32)
        if ids:
            self.fill(ids, out, list(range(len(ids))))
        rows: dict[int, bytes | None] = dict.fromkeys(self.by_seq)
        rows.update((s, out[i].numpy().tobytes()) for i, s in enumerate(ids))
        return rows

    def __reduce__(self):
        return PackedMasks, (self.packed(),)


class PackedMasks(_MaskSource):
    """Filled rows of one step's constrained sequences (a stage or worker process).

    Args:
        rows: seq_id -> the packed row as bytes (``ceil(vocab / 32)`` int32 words), None
            for a sequence still reasoning.
    """

    def __init__(self, rows: dict[int, bytes | None]):
        super().__init__(rows)

    def fill(self, seq_ids: list[int], out: torch.Tensor, rows: list[int]) -> None:
        """Copy the row of ``seq_ids[i]`` into row ``rows[i]`` of ``out``."""
        for sid, r in zip(seq_ids, rows):
            out[r] = torch.frombuffer(bytearray(self.by_seq[sid]), dtype=torch.int32)


class PendingBitmask:
    """The [k, words] int32 bitmask of a step's k constrained sample rows, built on the
    first :meth:`tensor` call (the sampler's), from one or more mask sources.

    Args:
        entries: per constrained sample row, in row order, (source, seq_id) where source
            is a :class:`StepMasks` or :class:`PackedMasks`.
        vocab_size: the logits width.
        device: where the sampler runs.
    """

    def __init__(self, entries: list[tuple[Any, int]], vocab_size: int, device: torch.device):
        self.entries = entries
        self.words = words_per_row(vocab_size)
        self.device = torch.device(device)
        self._tensor: torch.Tensor | None = None

    def tensor(self) -> torch.Tensor:
        """[k, words] int32 on ``device`` (filled and copied once; later calls reuse it)."""
        if self._tensor is None:
            host = _host_buffer(len(self.entries), self.words, self.device)
            groups: dict[int, tuple[Any, list[int], list[int]]] = {}
            for row, (source, seq_id) in enumerate(self.entries):
                _, ids, rows = groups.setdefault(id(source), (source, [], []))
                ids.append(seq_id)
                rows.append(row)
            for source, ids, rows in groups.values():
                source.fill(ids, host, rows)
            self._tensor = _upload(host, self.device)
        return self._tensor


# The reused pinned host buffer per (device, words), and each device's last upload event.
_pinned_buffers: dict[tuple[torch.device, int], torch.Tensor] = {}
_upload_events: dict[torch.device, torch.cuda.Event] = {}


def _host_buffer(rows: int, words: int, device: torch.device) -> torch.Tensor:
    """[rows, words] int32 host rows: a fresh tensor for a CPU device; on CUDA a view of
    a pinned buffer kept per (device, words), grown to the largest row count seen. The
    previous upload from it must have finished before it is written again (waited for)."""
    if device.type != "cuda":
        return torch.empty((rows, words), dtype=torch.int32)
    key = (device, words)
    buf = _pinned_buffers.get(key)
    if buf is None or buf.shape[0] < rows:
        buf = torch.empty((max(rows, 64), words), dtype=torch.int32, pin_memory=True)
        _pinned_buffers[key] = buf
    done = _upload_events.get(device)
    if done is not None:
        done.synchronize()
    return buf[:rows]


def _upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` on ``device``: an asynchronous copy from pinned memory on CUDA (its event
    recorded for :func:`_host_buffer`), the tensor itself on the CPU."""
    if device.type != "cuda":
        return host
    out = host.to(device, non_blocking=True)
    event = _upload_events.get(device)
    if event is None:
        event = _upload_events[device] = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return out
