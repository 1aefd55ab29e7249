"""Fakes that let the production capture/replay code run on CPU (docs/design.md: only the graph
object and the FlashInfer wrapper class are replaced).

- :class:`FakeCapturer`: "captures" by running the function once and returns a graph whose
  ``replay()`` re-runs it and copies the result into the captured output tensors, so a
  replay reads the static input buffers exactly as a CUDA graph would.
- :class:`FakeDecodeWrapper` / :class:`FakePrefillWrapper`: FlashInfer's constructor and
  ``plan`` contract (a CUDA-graph wrapper fixes its batch size to the length of its
  last_page_len buffer and raises FlashInfer's message on a mismatch; plan copies into the
  buffers it was given) with a plain PyTorch paged-attention reference as ``run``.
"""

from __future__ import annotations

import torch

from vllm.sequence import IntermediateTensors


class FakeGraph:
    def __init__(self, fn, output):
        self.fn = fn
        self.output = output
        self.replays = 0

    def replay(self) -> None:
        new = self.fn()
        if self.output is None:  # a graph without an output (decode-loop graphs)
            pass
        elif isinstance(self.output, IntermediateTensors):
            for k, v in self.output.items():
                v.copy_(new[k])
        else:
            self.output.copy_(new)
        self.replays += 1


class FakeCapturer:
    def __init__(self):
        self.captured: list[FakeGraph] = []

    def new_pool(self):
        return object()

    def capture(self, fn, pool):
        out = fn()
        g = FakeGraph(fn, out)
        self.captured.append(g)
        return g, out

    def synchronize(self) -> None:
        pass

    def memory_reserved(self, device) -> int:
        """Device memory the capture sees (nothing is counted on CPU)."""
        return 0

    def memory_allocated(self, device) -> int:
        """Live tensors' bytes the capture sees (nothing is counted on CPU)."""
        return 0


def _attend(q, kv_cache, pages, kv_len, causal_from=None, scale=None, window_left=-1):
    """q [n, H, D] against the first kv_len tokens of ``pages`` (read in q's dtype, as
    FlashInfer reads an 8-bit cache); causal_from: position of q[0] in the sequence
    (prefill), else every query sees all kv_len tokens (decode: the query is the last one).
    window_left >= 0: a query at position i sees keys from i - window_left on (FlashInfer's
    sliding window)."""
    k = kv_cache[pages, 0].reshape(-1, *kv_cache.shape[3:])[:kv_len].to(q.dtype)
    v = kv_cache[pages, 1].reshape(-1, *kv_cache.shape[3:])[:kv_len].to(q.dtype)
    n = q.shape[0]
    mask = None
    qpos = torch.arange(n)[:, None] + (kv_len - n if causal_from is None else causal_from)
    kpos = torch.arange(kv_len)[None, :]
    if causal_from is not None:
        mask = kpos <= qpos  # [n, kv_len]
    if window_left >= 0:
        inside = kpos >= qpos - window_left  # [n, kv_len]
        mask = inside if mask is None else mask & inside
    if mask is not None:
        mask = mask[None]
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.transpose(0, 1),
        v.transpose(0, 1),
        attn_mask=mask,
        scale=scale,
        enable_gqa=True,
    )
    return out.transpose(0, 1)  # [n, H, D]


def _sm_scale(planned, q, k_scale):
    """The softmax scale FlashInfer runs with: the planned one (head_dim ** -0.5 when
    None) times ``k_scale`` when given."""
    scale = planned if planned is not None else q.shape[-1] ** -0.5
    return scale if k_scale is None else scale * k_scale


class FakeDecodeWrapper:
    instances: list[FakeDecodeWrapper] = []

    def __init__(
        self,
        workspace,
        kv_layout="NHD",
        use_cuda_graph=False,
        use_tensor_cores=False,
        paged_kv_indptr_buffer=None,
        paged_kv_indices_buffer=None,
        paged_kv_last_page_len_buffer=None,
    ):
        self.use_cuda_graph = use_cuda_graph
        self.workspace = workspace
        if use_cuda_graph:
            self._fixed_batch_size = len(paged_kv_last_page_len_buffer)
            if len(paged_kv_indptr_buffer) != self._fixed_batch_size + 1:
                raise ValueError("The size of paged_kv_indptr_buffer should be batch_size + 1")
        self.indptr = paged_kv_indptr_buffer
        self.indices = paged_kv_indices_buffer
        self.last = paged_kv_last_page_len_buffer
        self.runs = 0
        FakeDecodeWrapper.instances.append(self)

    def plan(
        self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, **kw
    ):
        batch_size = len(last_page_len)
        self.page_size, self.sm_scale = page_size, kw.get("sm_scale")
        self.window_left = kw.get("window_left", -1)
        if self.use_cuda_graph:
            if batch_size != self._fixed_batch_size:
                raise ValueError(
                    "The batch size should be fixed in cudagraph mode, the runtime batch size "
                    f"{batch_size}  mismatches the batch size set during initialization "
                    f"{self._fixed_batch_size}"
                )
            if len(indices) > len(self.indices):
                raise ValueError(
                    "The size of indices should be less than or equal to the allocated buffer"
                )
            self.indptr.copy_(indptr)
            self.last.copy_(last_page_len)
            self.indices[: len(indices)].copy_(indices)
        else:
            self.indptr, self.indices, self.last = (
                indptr.clone(),
                indices.clone(),
                last_page_len.clone(),
            )

    def run(self, q, kv_cache, k_scale=None, v_scale=None):
        """FlashInfer's decode: ``k_scale`` multiplies the softmax scale, ``v_scale`` the
        output (None: 1); the scales of the last run are kept in ``kv_scales``."""
        self.runs += 1
        self.kv_scales = (k_scale, v_scale)
        out = torch.empty_like(q)
        indptr, last = self.indptr.tolist(), self.last.tolist()
        sm_scale = _sm_scale(self.sm_scale, q, k_scale)
        for i in range(len(last)):
            pages = self.indices[indptr[i] : indptr[i + 1]].long()
            kv_len = (len(pages) - 1) * self.page_size + last[i]
            out[i : i + 1] = _attend(q[i : i + 1], kv_cache, pages, kv_len, scale=sm_scale,
                                     window_left=self.window_left)  # fmt: skip
        return out if v_scale is None else out * v_scale


class FakePrefillWrapper:
    def __init__(self, workspace, kv_layout="NHD"):
        self.runs = 0

    def plan(
        self,
        qo_indptr,
        indptr,
        indices,
        last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim_qk,
        page_size,
        causal=True,
        **kw,
    ):
        self.qo, self.indptr, self.indices, self.last = qo_indptr, indptr, indices, last_page_len
        self.page_size, self.sm_scale = page_size, kw.get("sm_scale")
        self.window_left = kw.get("window_left", -1)

    def run(self, q, kv_cache, k_scale=None, v_scale=None):
        """FlashInfer's paged prefill; scales as :meth:`FakeDecodeWrapper.run`."""
        self.runs += 1
        self.kv_scales = (k_scale, v_scale)
        out = torch.empty_like(q)
        sm_scale = _sm_scale(self.sm_scale, q, k_scale)
        qo, indptr, last = self.qo.tolist(), self.indptr.tolist(), self.last.tolist()
        for i in range(len(last)):
            pages = self.indices[indptr[i] : indptr[i + 1]].long()
            kv_len = (len(pages) - 1) * self.page_size + last[i]
            n = qo[i + 1] - qo[i]
            out[qo[i] : qo[i + 1]] = _attend(
                q[qo[i] : qo[i + 1]],
                kv_cache,
                pages,
                kv_len,
                causal_from=kv_len - n,
                scale=sm_scale,
                window_left=self.window_left,
            )
        return out if v_scale is None else out * v_scale


def reintroduce_shared_rebound_buffers(monkeypatch) -> None:
    """Monkeypatch the upstream PP bug back in: one FlashInfer graph state shared by every
    virtual engine (allocated once), whose full-size buffer handles are rebound to each
    captured slice. Capturing the second VE's largest size then sees a buffer of the first
    VE's smallest size and FlashInfer raises "The batch size should be fixed in cudagraph
    mode ...". Used by the CPU (fake wrapper) and GPU (real FlashInfer) regression tests."""
    from vllm.attention.backends.flashinfer import FlashInferBackend
    from vllm.attention.backends.flashinfer.flashinfer_graph import FlashInferGraphState

    shared = {}
    real_make = FlashInferBackend.make_graph_state
    real_allocate = FlashInferGraphState.allocate

    def make_shared(self, scratch_slot):
        if "state" not in shared:
            shared["state"] = real_make(self, scratch_slot)
        return shared["state"]

    def allocate_once(self, max_bs):
        if not getattr(self, "_allocated", False):
            real_allocate(self, max_bs)
            self._allocated = True

    def rebinding_views(self, bs):
        self.captured.clear()  # a new wrapper per capture, as upstream makes
        self.paged_kv_indptr = self.paged_kv_indptr[: bs + 1]
        self.paged_kv_last_page_len = self.paged_kv_last_page_len[:bs]
        return self.paged_kv_indptr, self.paged_kv_indices, self.paged_kv_last_page_len

    monkeypatch.setattr(FlashInferBackend, "make_graph_state", make_shared)
    monkeypatch.setattr(FlashInferGraphState, "allocate", allocate_once)
    monkeypatch.setattr(FlashInferGraphState, "_views", rebinding_views)
