"""FLASHINFER: paged attention through FlashInfer's batch prefill and decode wrappers.

KV-cache layout per layer: [num_blocks + 1, 2, block_size, num_kv_heads, head_size]
("NHD", key at index 0 of dim 1); block ``num_blocks`` is the scratch block.

Planning (``wrapper.plan``) takes pinned host tensors (FlashInfer plans on the host and
copies them to its device buffers without blocking), except a graph replay's page indices,
which are uploaded first (FlashInfer copies host indices into a graph buffer with a
blocking copy); so no step waits on the device.
flashinfer is imported lazily; the wrapper classes are parameters of the backend so the
CUDA-graph state runs on CPU in tests with a fake decode wrapper (same constructor and
``plan`` checks as FlashInfer's).

A step takes one of three paths: decode steps of at most ``spec.small_decode_max_rows``
rows run the Triton small-decode kernel (:mod:`.small_decode`), a graph prefill (or an eager
step padded like one) the capturable prefill (:mod:`.flashinfer_prefill`), every other step
a planned wrapper (:mod:`.metadata`). A MIXED step (chunked prefill) runs on the prefill
wrapper alone: a decode row is a prefill row of one new token after its cached context.
CUDA-graph state (per virtual engine buffers and per-size decode wrappers) lives in
:mod:`.flashinfer_graph`.

Sliding windows (Gemma 3): FlashInfer takes the window at plan time (``window_left``), so
every planned step plans one wrapper per distinct window of the model
(``AttentionSpec.sliding_windows``) besides the full-attention one, over the same page
tables, and each layer runs the wrapper of its own window. Such models (and models with
an attention score cap) bypass the small-decode kernel, which has neither.

An 8-bit cache (``--kv-cache-dtype fp8``; vllm/attention/kv_cache_dtype.py): the wrappers
are planned with it as ``kv_data_type``, the cache is written divided by each layer's
k_scale / v_scale and rounded (:func:`.paged_cache.write_kv`), ``run`` gets the layer's
scales (:class:`.metadata.FlashInferImpl`), the graph prefill attends to the rounded keys
and values times the scales, as the wrappers read them, and the small-decode kernel,
which reads and writes the model's dtype, is bypassed.
"""

from __future__ import annotations

from typing import Any

import torch

from vllm.attention.backends.abstract import (
    AttentionBackend,
    AttentionMetadata,
    AttentionSpec,
    ForwardMode,
    StepInputs,
)
from vllm.attention.backends.flashinfer.flashinfer_graph import FlashInferGraphState
from vllm.attention.backends.flashinfer.flashinfer_prefill import graph_prefill_metadata
from vllm.attention.backends.flashinfer.metadata import FlashInferMetadata
from vllm.attention.backends.flashinfer.paged_cache import (
    paged_kv_host,
    plan_paged,
    slot_rows_host,
)
from vllm.attention.backends.flashinfer.prebuild import ModulePrebuild
from vllm.attention.backends.flashinfer.small_decode import (
    SMALL_DECODE_MAX_ROWS_LIMIT,
    SmallDecodeBuffers,
)
from vllm.utils import to_device

WORKSPACE_BYTES = 128 * 1024 * 1024


def _wrapper_classes() -> tuple[type, type]:
    import flashinfer

    return (
        flashinfer.BatchPrefillWithPagedKVCacheWrapper,
        flashinfer.BatchDecodeWithPagedKVCacheWrapper,
    )


LOOP_EVERY_SIZE = 1 << 30  # loop_max_rows() above any decode capture size


def use_tensor_cores(num_heads: int, num_kv_heads: int) -> bool:
    """FlashInfer's CUDA-core decode kernels cover GQA group sizes 1, 2, 4 and 8 only."""
    return (num_heads // num_kv_heads) not in (1, 2, 4, 8)


class FlashInferBackend(AttentionBackend):
    """The FLASHINFER backend (default on CUDA for float16/bfloat16).

    Args:
        spec: shapes, dtype, device, and ``small_decode_max_rows`` (the engine's
            ``CompilationConfig.small_decode_max_rows``: the most decode rows the Triton
            small-decode path takes; 0 = off).
        prefill_wrapper_cls, decode_wrapper_cls: FlashInfer's wrapper classes (imported
            lazily when None; tests pass fakes).
        prebuild: start building the model's FlashInfer modules in the background now
            (:mod:`.prebuild`; about 32 MiB of device memory until the builds end); None
            means on a CUDA device.

    Raises:
        ValueError: ``spec.small_decode_max_rows`` outside [0, SMALL_DECODE_MAX_ROWS_LIMIT].
        torch.OutOfMemoryError: no room for the prebuild's workspace (see ``prebuild``).
    """

    name = "FLASHINFER"
    supports_prefill_graphs = True  # flashinfer_prefill.py

    def __init__(
        self,
        spec: AttentionSpec,
        prefill_wrapper_cls: type | None = None,
        decode_wrapper_cls: type | None = None,
        prebuild: bool | None = None,
    ):
        super().__init__(spec)  # float32 is refused by the selector during validation
        if prefill_wrapper_cls is None or decode_wrapper_cls is None:
            p, d = _wrapper_classes()
            prefill_wrapper_cls = prefill_wrapper_cls or p
            decode_wrapper_cls = decode_wrapper_cls or d
        self.prefill_wrapper_cls = prefill_wrapper_cls
        self.decode_wrapper_cls = decode_wrapper_cls
        self.tensor_cores = use_tensor_cores(spec.num_heads, spec.num_kv_heads)
        self._workspace = None
        self._prefill = None
        self._decode = None
        self._windowed: dict[int, tuple[Any, Any]] | None = None
        self.prefill_runs = 0
        self.decode_runs = 0
        self.small_decode_runs = 0  # decode steps on the Triton small-batch path
        self.graph_prefill_runs = 0  # graph prefills (replayed or padded eager), no wrapper
        if not 0 <= spec.small_decode_max_rows <= SMALL_DECODE_MAX_ROWS_LIMIT:
            raise ValueError(
                f"small_decode_max_rows={spec.small_decode_max_rows} must be in "
                f"[0, {SMALL_DECODE_MAX_ROWS_LIMIT}] (0 = off)."
            )
        # The Triton small-decode kernel attends to the whole context without a score cap,
        # over a cache in the model's dtype: a model with windowed layers or capped scores,
        # or an 8-bit cache, bypasses it (FlashInfer decodes).
        self.windows: tuple[int, ...] = tuple(spec.sliding_windows)
        bypass_small = (
            bool(self.windows)
            or spec.logits_soft_cap is not None
            or spec.kv_cache_dtype is not None
        )
        self.small_max_rows = 0 if bypass_small else spec.small_decode_max_rows
        self._small: SmallDecodeBuffers | None = None
        self.prebuild: ModulePrebuild | None = None
        if (spec.device.type == "cuda") if prebuild is None else prebuild:
            self.prebuild = ModulePrebuild(spec.device, self._prebuild_plans, spec.head_size)

    def _prebuild_plans(self, workspace: torch.Tensor) -> list[list[tuple[Any, bool, dict]]]:
        """The plans :class:`.prebuild.ModulePrebuild` runs once, one list per thread:
        (wrapper, is_prefill, plan kwargs) for each wrapper kind and window this backend
        plans, over ``workspace``. Prefill and decode modules build side by side, except
        with tensor-core decode, which plans FlashInfer's prefill module (possibly the
        very module the prefill wrapper builds): then both are planned on one thread."""
        prefill, decode = [], []
        for window in (None, *self.windows):
            kw = self.plan_kwargs(window)
            prefill.append((self.prefill_wrapper_cls(workspace, "NHD"), True, kw))
            wrapper = self.decode_wrapper_cls(workspace, "NHD", use_tensor_cores=self.tensor_cores)
            decode.append((wrapper, False, kw))
        return [prefill + decode] if self.tensor_cores else [prefill, decode]

    def wait_prebuild(self) -> None:
        """Wait for the background module builds (if any) to finish: called before this
        backend creates a wrapper of its own."""
        if self.prebuild is not None:
            self.prebuild.wait()

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int, block_size: int, num_kv_heads: int, head_size: int
    ) -> tuple[int, ...]:
        return (num_blocks, 2, block_size, num_kv_heads, head_size)

    def workspace(self) -> torch.Tensor:
        """FlashInfer's float workspace [WORKSPACE_BYTES] uint8 (scratch of split-KV runs),
        allocated once and shared by the eager wrappers and every VE's graph wrappers, as
        upstream vLLM shares it: a worker runs all its attention on one CUDA stream, one
        pass at a time, and plan information lives in each wrapper's own int workspace."""
        if self._workspace is None:
            self._workspace = torch.zeros(
                WORKSPACE_BYTES, dtype=torch.uint8, device=self.spec.device
            )
        return self._workspace

    def _eager_wrappers(self):
        """The (prefill, decode) wrappers of full-attention layers."""
        if self._prefill is None:
            self.wait_prebuild()
            ws = self.workspace()
            self._prefill = self.prefill_wrapper_cls(ws, "NHD")
            self._decode = self.decode_wrapper_cls(ws, "NHD", use_tensor_cores=self.tensor_cores)
        return self._prefill, self._decode

    def _all_eager_wrappers(self) -> dict[int | None, tuple[Any, Any]]:
        """(prefill, decode) wrappers per window: None for full-attention layers, then one
        pair per distinct sliding window of the model (FlashInfer fixes the window at plan
        time), all over the shared workspace."""
        if self._windowed is None:
            self.wait_prebuild()
            ws = self.workspace()
            self._windowed = {
                w: (
                    self.prefill_wrapper_cls(ws, "NHD"),
                    self.decode_wrapper_cls(ws, "NHD", use_tensor_cores=self.tensor_cores),
                )
                for w in self.windows
            }
        return {None: self._eager_wrappers(), **self._windowed}

    def plan_kwargs(self, window: int | None = None) -> dict[str, Any]:
        """Keyword arguments of a wrapper's ``plan`` for layers of sliding ``window`` (None:
        full attention): FlashInfer's ``window_left`` counts the keys left of the query,
        so a window of W tokens (the query's own included) is ``window_left = W - 1``."""
        s = self.spec
        return dict(
            num_qo_heads=s.num_heads,
            num_kv_heads=s.num_kv_heads,
            page_size=s.block_size,
            q_data_type=s.dtype,
            kv_data_type=s.cache_dtype,
            sm_scale=s.scale if s.scale is not None else s.head_size**-0.5,
            window_left=-1 if window is None else window - 1,
            logits_soft_cap=s.logits_soft_cap,
        )

    def small(self) -> SmallDecodeBuffers:
        """The small-batch decode path's buffers (created on first use)."""
        if self._small is None:
            self._small = SmallDecodeBuffers(self.spec, self.small_max_rows)
        return self._small

    @property
    def loops_over_wrappers(self) -> bool:
        """Whether decode-loop graphs also run FlashInfer's decode wrappers, planned once
        per call (:mod:`.loop_plan`): with tensor-core decode (its kernel clamps every KV
        chunk to the row's length at run time; FlashInfer's CUDA-core decode kernel does
        not clamp a chunk's start) and no sliding window."""
        return self.tensor_cores and not self.windows

    def loop_max_rows(self) -> int:
        """Every captured size when :attr:`loops_over_wrappers`, else the small-decode
        limit (only that path's graph buffers then advance on the device)."""
        return LOOP_EVERY_SIZE if self.loops_over_wrappers else self.small_max_rows

    def takes_small_path(self, mode: ForwardMode, rows: int) -> bool:
        """Whether a step of ``rows`` rows (padded ones included) runs the Triton small
        decode kernel (:mod:`.small_decode`) instead of FlashInfer."""
        return mode == ForwardMode.DECODE and 0 < rows <= self.small_max_rows

    def build_metadata(self, step: StepInputs, scratch_slot: int) -> AttentionMetadata:
        if self.takes_small_path(step.mode, len(step.seq_lens)):
            self.small_decode_runs += 1
            return self.small().build_metadata(step, scratch_slot)
        if step.graph_prefill:  # an eager step padded like a prefill graph: same kernels
            self.graph_prefill_runs += 1
            rows = slot_rows_host(step.slot_mapping, scratch_slot, self.spec.block_size)
            return graph_prefill_metadata(to_device(rows, self.spec.device), scratch_slot)
        indptr, indices, last = paged_kv_host(
            step, self.spec.block_size, scratch_slot // self.spec.block_size
        )
        planned: dict[int | None, Any] = {}
        as_prefill = step.mode in (ForwardMode.PREFILL, ForwardMode.MIXED)
        for window, (prefill, decode) in self._all_eager_wrappers().items():
            kw = self.plan_kwargs(window)
            if as_prefill:
                qo = torch.zeros(len(step.query_lens) + 1, dtype=torch.int32)
                qo[1:] = torch.tensor(step.query_lens, dtype=torch.int32).cumsum(0)
                plan_paged(prefill, kw, self.spec.head_size, indptr, indices, last, qo)
                planned[window] = prefill
            else:
                plan_paged(decode, kw, self.spec.head_size, indptr, indices, last)
                planned[window] = decode
        if as_prefill:
            self.prefill_runs += 1
        else:
            self.decode_runs += 1
        wrapper = planned.pop(None)
        rows = to_device(
            slot_rows_host(step.slot_mapping, scratch_slot, self.spec.block_size),
            self.spec.device,
        )  # [3, num_tokens]
        return FlashInferMetadata(
            mode=step.mode,
            num_rows=len(step.seq_lens),
            num_tokens=len(step.slot_mapping),
            slot_mapping=rows[0],
            scratch_slot=scratch_slot,
            wrapper=wrapper,
            kv_rows=rows[1:],
            window_wrappers=planned,
        )

    def make_graph_state(self, scratch_slot: int) -> Any:
        """A :class:`~.flashinfer_graph.FlashInferGraphState`."""
        self.wait_prebuild()
        return FlashInferGraphState(self, scratch_slot)
