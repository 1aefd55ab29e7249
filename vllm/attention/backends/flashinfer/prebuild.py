"""Build FlashInfer's JIT modules for this model in the background while the weights load.

FlashInfer compiles its prefill and decode kernels for each (dtypes, head size, sliding
window, score cap) combination the first time a wrapper is planned with it, and caches the
result on disk. Without help, a fresh machine compiles them one after the other at the first
use: the prefill module in the profile run, the decode module at graph capture (on an H200,
roughly 75 s and 25 s at head size 64, more at 128), each after the weights have loaded.

:class:`ModulePrebuild` starts, when the backend is created (before the weights load),
threads that plan wrappers of each kind on a one-row, one-page batch with the backend's own
plan arguments for every window of the model; planning is what makes FlashInfer build (or,
when cached, load) the module. The prefill and decode builds run side by side (each a
separate ninja build under FlashInfer's own file lock; plans that could build the same
module share a thread) and overlap the weight loading. The backend calls
:meth:`ModulePrebuild.wait`, which also waits for any other backend's builds in the process,
before it creates any wrapper of its own, so the engine never plans a module that a thread
is still building.

With warm caches the threads only load the cached modules (well under a second). A failed
build is logged and otherwise ignored: the engine's own first plan then builds again and
raises the error where it always did.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from vllm.attention.backends.flashinfer.paged_cache import plan_paged

logger = logging.getLogger(__name__)

PREBUILD_WORKSPACE_BYTES = 16 * 1024 * 1024


def plan_one_row(wrapper: Any, prefill: bool, head_size: int, kwargs: dict[str, Any]) -> None:
    """Plan ``wrapper`` on one row of one token in one page (page 0, one valid entry), as
    the engine plans it (:func:`.paged_cache.plan_paged`).

    Args:
        wrapper: a FlashInfer prefill or decode wrapper over the paged cache ("NHD").
        prefill: whether it is a prefill wrapper or a decode one.
        head_size: the attention head size.
        kwargs: the backend's ``plan_kwargs(window)`` (heads, page size, dtypes, scale,
            window, score cap): these, with ``head_size``, select the module.
    """
    one = torch.tensor([0, 1], dtype=torch.int32)  # [rows + 1]: indptr, and qo_indptr
    pages = torch.zeros(1, dtype=torch.int32)  # [pages]
    last = torch.ones(1, dtype=torch.int32)  # [rows]
    plan_paged(wrapper, kwargs, head_size, one, pages, last, one if prefill else None)


Plan = tuple[Any, bool, dict[str, Any]]  # (wrapper, is_prefill, plan kwargs)

# Every ModulePrebuild of this process whose threads may still run: a wait covers them all,
# so a second backend in the process (a speculative draft model's) never plans a module
# that the first one's thread is still building, and vice versa.
_LIVE: list[ModulePrebuild] = []
_LIVE_LOCK = threading.Lock()


class ModulePrebuild:
    """Background builds of the FlashInfer modules one backend will plan.

    Args:
        device: the CUDA device the wrappers live on (an index-less ``cuda`` means the
            current device).
        make_wrappers: ``(workspace) -> one list of plans per thread``, each plan a
            (wrapper, is_prefill, plan kwargs) over ``workspace`` [PREBUILD_WORKSPACE_BYTES]
            uint8 on ``device``. Plans that may build the same module must share a list:
            the threads must never build one module twice at once.
        head_size: the attention head size.

    Memory: the workspace (16 MiB) and what the wrappers allocate (FlashInfer: an 8 MiB
    int workspace each) stay allocated until the threads end, which :meth:`wait` awaits
    before the engine profiles its memory.

    Raises:
        torch.OutOfMemoryError: the workspace does not fit; whatever ``make_wrappers``
            raises (a wrapper's constructor). Errors inside the threads are not raised.

    Attributes:
        seconds: wall seconds from the start until the last thread finished (set by
            :meth:`wait`), None before.
        errors: the exceptions the threads raised (logged with their traceback, kept
            without it so that their frames, and the wrappers, are freed).
    """

    def __init__(
        self,
        device: torch.device,
        make_wrappers: Callable[[torch.Tensor], list[list[Plan]]],
        head_size: int,
    ):
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.head_size = head_size
        self.seconds: float | None = None
        self.errors: list[BaseException] = []
        self._t0 = time.perf_counter()
        self._done_at = self._t0
        workspace = torch.zeros(PREBUILD_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._threads = [
            threading.Thread(
                target=self._run, args=(plans,), name="flashinfer-prebuild", daemon=True
            )
            for plans in make_wrappers(workspace)
            if plans
        ]
        with _LIVE_LOCK:
            _LIVE.append(self)
        for t in self._threads:
            t.start()

    def _run(self, plans: list[Plan]) -> None:
        try:
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            with torch.inference_mode():
                for wrapper, prefill, kwargs in plans:
                    plan_one_row(wrapper, prefill, self.head_size, kwargs)
        except BaseException as e:  # the engine's own first plan reports it
            logger.warning("FlashInfer module prebuild failed; building at first use.",
                           exc_info=True)  # fmt: skip
            self.errors.append(e.with_traceback(None))
        finally:
            self._done_at = max(self._done_at, time.perf_counter())

    def _join(self) -> None:
        for t in self._threads:
            t.join()
        with _LIVE_LOCK:
            if self in _LIVE:
                _LIVE.remove(self)

    def wait(self) -> None:
        """Block until this object's build threads, and those of every other prebuild of
        the process still running, have finished (idempotent); logs the time this one's
        builds took when it was more than a second (a cold JIT cache)."""
        if self.seconds is not None:
            return
        self._join()
        with _LIVE_LOCK:
            others = list(_LIVE)
        for other in others:
            other._join()
        self.seconds = self._done_at - self._t0
        if self.seconds > 1.0:
            logger.info(
                "FlashInfer modules for head size %d built in %.1f s (in the background)",
                self.head_size,
                self.seconds,
            )
