"""The capture-size rule (docs/design.md): one function, used by capture and by nothing else.

Dispatch never re-derives sizes: it asks which sizes were captured (membership in the
virtual engine's ``graph_runners``), so the rule and the gate cannot drift apart — the
upstream ``KeyError: 40`` came from a gate that assumed sizes up to 256 existed.
"""

from __future__ import annotations

import bisect
import logging
import os
from dataclasses import dataclass

logger = logging.getLogger(__name__)


def next_size(sizes: tuple[int, ...], n: int) -> int | None:
    """The smallest of ``sizes`` (sorted ascending) that is >= ``n``, or None: the size a
    batch of ``n`` rows (decode) or a prompt of ``n`` tokens (prefill) is padded to."""
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None


@dataclass(frozen=True)
class CaptureSizes:
    """The captured decode batch sizes and the maximum.

    Attributes:
        sizes: sorted, unique batch sizes to capture ([] when graphs are off).
        max_batchsize_to_capture: ``sizes[-1]``, or 0 when graphs are off.
        scheduler_max_rows: the most decode rows the scheduler can produce
            (max_num_seqs x (k + 1)).
    """

    sizes: tuple[int, ...]
    max_batchsize_to_capture: int
    scheduler_max_rows: int

    def padded_size(self, batch_size: int) -> int | None:
        """The smallest captured size >= ``batch_size``, or None (run eagerly)."""
        return next_size(self.sizes, batch_size)

    def eager_batch_sizes(self) -> range:
        """Decode batch sizes the scheduler can produce that will run eagerly."""
        return range(self.max_batchsize_to_capture + 1, self.scheduler_max_rows + 1)


def capture_sizes(
    max_num_seqs: int,
    num_speculative_tokens: int = 0,
    max_cudagraph_capture_size: int = 512,
    cuda_graph_sizes: list[int] | None = None,
    enforce_eager: bool = False,
) -> CaptureSizes:
    """Decode batch sizes to capture.

    Rule: k = ``num_speculative_tokens`` (0 without speculation; a draft model uses 0);
    maximum = min(max_num_seqs x (k + 1), max_cudagraph_capture_size), not padded; sizes =
    those of 1, 2, 4 and the multiples of 8 below the maximum, then the maximum itself.
    ``cuda_graph_sizes`` replaces the list (sorted, deduplicated, its last entry is the
    maximum). ``enforce_eager`` (or CPU) gives no sizes and maximum 0.

    Examples: max_num_seqs=3 -> [1, 2, 3]; 5 -> [1, 2, 4, 5]; (8, k=4) -> [1, 2, 4, 8, 16,
    24, 32, 40]; (8, k=4) with a ceiling of 16 -> [1, 2, 4, 8, 16].

    Raises:
        ValueError: max_num_seqs < 1, k < 0, a ceiling < 1 or a size < 1.
    """
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be at least 1, got {max_num_seqs}.")
    if num_speculative_tokens < 0:
        raise ValueError(f"num_speculative_tokens must be >= 0, got {num_speculative_tokens}.")
    if max_cudagraph_capture_size < 1:
        raise ValueError(
            f"max_cudagraph_capture_size must be at least 1, got {max_cudagraph_capture_size}."
        )
    rows = max_num_seqs * (num_speculative_tokens + 1)
    if enforce_eager:
        return CaptureSizes((), 0, rows)
    if cuda_graph_sizes:
        if min(cuda_graph_sizes) < 1:
            raise ValueError(f"cuda_graph_sizes must be >= 1, got {cuda_graph_sizes}.")
        sizes = tuple(sorted(set(int(s) for s in cuda_graph_sizes)))
    else:
        top = min(rows, max_cudagraph_capture_size)
        candidates = [1, 2, 4, *range(8, top, 8)]
        sizes = tuple([s for s in candidates if s < top] + [top])
    return CaptureSizes(sizes, sizes[-1], rows)


def warn_eager_sizes(cs: CaptureSizes) -> str | None:
    """Log once, at start-up, which decode batch sizes will run eagerly; returns the
    message (None when every producible size has a graph or graphs are off)."""
    if not cs.sizes or cs.max_batchsize_to_capture >= cs.scheduler_max_rows:
        return None
    eager = cs.eager_batch_sizes()
    msg = (
        f"CUDA graphs are captured up to batch size {cs.max_batchsize_to_capture}; decode "
        f"batches of {eager.start}-{eager.stop - 1} rows (the scheduler can produce up to "
        f"{cs.scheduler_max_rows}) will run eagerly."
    )
    logger.warning(msg)
    return msg


ENV_PREFILL_GRAPH_MAX_TOKENS = "VLLM_PREFILL_GRAPH_MAX_TOKENS"
# 512: eleven graphs (16 ... 512). The 13 of 1024, two warm-ups each, added 1.9 s to
# SmolLM2's capture on an H200 (4.4 s in all at max_num_seqs 256, near the 5 s budget)
DEFAULT_PREFILL_GRAPH_MAX_TOKENS = 512


def prefill_graph_max_tokens() -> int:
    """The longest prompt (tokens) a prefill graph serves: ``VLLM_PREFILL_GRAPH_MAX_TOKENS``
    (default 512; 0 captures no prefill graphs).

    Raises:
        ValueError: a value that is not an integer >= 0.
    """
    raw = os.environ.get(ENV_PREFILL_GRAPH_MAX_TOKENS, str(DEFAULT_PREFILL_GRAPH_MAX_TOKENS))
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{ENV_PREFILL_GRAPH_MAX_TOKENS}={raw!r} must be an integer >= 0.")
    return value


def prefill_capture_sizes(max_tokens: int) -> tuple[int, ...]:
    """Token counts of the single-sequence prefill graphs (sorted; () when ``max_tokens``
    is 0).

    Rule: 16 x 2^i and 24 x 2^i (16, 24, 32, 48, 64, 96, 128, 192, ...) below
    ``max_tokens``, then ``max_tokens`` itself, so a prompt is padded by less than half its
    length (at least 16 tokens for short ones) and every prompt up to the maximum has a size.
    The caller passes min(VLLM_PREFILL_GRAPH_MAX_TOKENS, max_num_batched_tokens,
    max_model_len). Example: 100 -> (16, 24, 32, 48, 64, 96, 100).

    Raises:
        ValueError: ``max_tokens`` < 0.
    """
    if max_tokens < 0:
        raise ValueError(f"the prefill graph maximum must be >= 0 tokens, got {max_tokens}.")
    if max_tokens == 0:
        return ()
    ladder = sorted({b << i for b in (16, 24) for i in range(max_tokens.bit_length())})
    return tuple([s for s in ladder if s < max_tokens] + [max_tokens])
