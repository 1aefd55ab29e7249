"""The capture-size rules (docs/design.md): decode batch sizes and prefill token counts.

Dispatch never re-derives sizes: the planner asks which sizes were captured (membership in
the virtual engine's graphs), so the rule and the gate cannot drift apart — the upstream
``KeyError: 40`` came from a gate that assumed sizes up to 256 existed.
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.config import EngineConfig

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


def prefill_capture_sizes(max_tokens: int) -> tuple[int, ...]:
    """Token counts of the single-sequence prefill graphs (sorted; () when ``max_tokens``
    is 0).

    Rule: 16 x 2^i and 24 x 2^i (16, 24, 32, 48, 64, 96, 128, 192, ...) below
    ``max_tokens``, then ``max_tokens`` itself, so a prompt is padded by less than half its
    length (at least 16 tokens for short ones) and every prompt up to the maximum has a size.
    The caller passes min(``CompilationConfig.prefill_graph_max_tokens``,
    max_num_batched_tokens, max_model_len). Example: 100 -> (16, 24, 32, 48, 64, 96, 100).

    Raises:
        ValueError: ``max_tokens`` < 0.
    """
    if max_tokens < 0:
        raise ValueError(f"the prefill graph maximum must be >= 0 tokens, got {max_tokens}.")
    if max_tokens == 0:
        return ()
    ladder = sorted({b << i for b in (16, 24) for i in range(max_tokens.bit_length())})
    return tuple([s for s in ladder if s < max_tokens] + [max_tokens])


# piecewise sizes above this many tokens are its multiples (padding below one step of it)
PIECEWISE_STEP = 256


def piecewise_capture_sizes(max_tokens: int) -> tuple[int, ...]:
    """Token counts of the piecewise graphs (sorted; () when ``max_tokens`` is 0).

    Rule: the prefill ladder (:func:`prefill_capture_sizes`) up to ``PIECEWISE_STEP``
    (256), then its multiples, then ``max_tokens`` itself. A large step is GPU-bound, so
    its padding costs in proportion: below 256 tokens a step pads by less than half its
    length, above by less than 256 tokens (under 10% from 2,560 tokens on). Example: 1000
    -> (16, 24, 32, 48, 64, 96, 128, 192, 256, 512, 768, 1000).

    Raises:
        ValueError: ``max_tokens`` < 0.
    """
    small = prefill_capture_sizes(min(max_tokens, PIECEWISE_STEP))
    large = range(2 * PIECEWISE_STEP, max_tokens, PIECEWISE_STEP)
    return tuple(sorted({*small, *large, *([max_tokens] if max_tokens else [])}))


def loop_capture_sizes(
    capture: tuple[int, ...], num_scheduler_steps: int, max_rows: int, disabled: bool = False
) -> tuple[int, ...]:
    """Captured decode sizes that also get a decode-loop graph: those up to ``max_rows``
    (the attention backend's ``loop_max_rows``: the sizes its graph state advances on the
    device) when multi-step decoding is on (``num_scheduler_steps`` > 1) and
    ``CompilationConfig.disable_decode_loop_graphs`` is off, else ()."""
    if num_scheduler_steps <= 1 or disabled:
        return ()
    return tuple(sorted(s for s in capture if s <= max_rows))


@dataclass(frozen=True)
class GraphSpec:
    """Everything one stage's graph runner captures, decided once from the engine config.

    Attributes:
        sizes: the decode batch sizes (the rule's sizes as if graphs were on: they are
            also the padding targets of the eager debug switch).
        prefill_sizes: token counts of the one-sequence prefill graphs (sorted; () at
            PP > 1, on a backend without prefill graphs, or with the maximum at 0).
        loop_sizes: decode sizes with a decode-loop graph (sorted).
        loop_steps: steps a decode-loop graph's ring holds (num_scheduler_steps; 0 when
            there are no loop graphs).
        max_seq_len_to_capture: longest context (tokens) a decode graph serves.
        piecewise_sizes: token counts of the piecewise graphs of prefill and mixed steps
            (vllm/cudagraph/piecewise.py; sorted; () at PP > 1 or with the maximum at 0).
    """

    sizes: CaptureSizes
    prefill_sizes: tuple[int, ...] = ()
    loop_sizes: tuple[int, ...] = ()
    loop_steps: int = 0
    max_seq_len_to_capture: int = 8192
    piecewise_sizes: tuple[int, ...] = ()


def graph_spec(
    config: EngineConfig, pp_size: int, supports_prefill_graphs: bool, loop_max_rows: int
) -> GraphSpec:
    """The :class:`GraphSpec` of one pipeline stage of an engine ``config``
    (the draft model of speculative decoding passes its own).

    Decode sizes: :func:`capture_sizes` with k = num_speculative_tokens. Prefill sizes:
    :func:`prefill_capture_sizes` up to min(prefill_graph_max_tokens,
    max_num_batched_tokens, max_model_len) at PP = 1 on a backend that supports them.
    Loop sizes: :func:`loop_capture_sizes` up to ``loop_max_rows`` (the backend's
    ``loop_max_rows()``; at PP = TP = 1 only: under PP the stages run a call's passes, at
    TP > 1 rank 0's sampled ids reach the other ranks between passes).
    Piecewise sizes: :func:`piecewise_capture_sizes` up to min(piecewise_graph_max_tokens,
    max_num_batched_tokens) at PP = 1 (a step never has more tokens than the budget).
    """
    cc = config.compilation_config
    sc = config.scheduler_config
    spec = config.speculative_config
    k = getattr(spec, "num_speculative_tokens", 0) if spec is not None else 0
    sizes = capture_sizes(sc.max_num_seqs, k, cc.max_cudagraph_capture_size, cc.cuda_graph_sizes)
    prefill: tuple[int, ...] = ()
    if pp_size == 1 and supports_prefill_graphs:
        cap = min(cc.prefill_graph_max_tokens, sc.max_num_batched_tokens,
                  config.model_config.max_model_len)  # fmt: skip
        prefill = prefill_capture_sizes(cap)
    single = pp_size == 1 and config.parallel_config.tensor_parallel_size == 1
    steps = sc.num_scheduler_steps if single else 0
    loops = loop_capture_sizes(sizes.sizes, steps, loop_max_rows, cc.disable_decode_loop_graphs)
    piecewise: tuple[int, ...] = ()
    if pp_size == 1:
        piecewise = piecewise_capture_sizes(
            min(cc.piecewise_graph_max_tokens, sc.max_num_batched_tokens)
        )
    return GraphSpec(sizes, prefill, loops, steps if loops else 0, cc.max_seq_len_to_capture,
                     piecewise)  # fmt: skip
