"""Sliding-window attention and score soft-capping (Gemma 3) against a plain reference.

A layer with ``sliding_window = W`` lets the query at position i see keys i - W < j <= i.
The reference loops over rows and positions with an explicit softmax; TORCH_SDPA must match
it on decode rows whose context is longer than the window, on prefill and on prefill over a
cached context; FLASHINFER (fake wrappers of tests/worker/fakes.py, which honour
``window_left`` as FlashInfer does) must plan the windowed layer's wrapper with
``window_left = W - 1``, eagerly and in the graph state, and bypass the small-decode kernel.
"""

from types import SimpleNamespace

import pytest
import torch

from tests.worker.fakes import FakeDecodeWrapper, FakePrefillWrapper
from vllm.attention.backends.abstract import AttentionSpec, ForwardMode, StepInputs

H, H_KV, D, BS, NUM_BLOCKS, W = 4, 2, 16, 4, 16, 5
SCALE = 0.2
# decode rows (context length with the new token, block table): below, at and past the window
DECODE_ROWS = [(3, [7]), (5, [2, 9]), (14, [0, 11, 4, 6])]
# prefill rows (length, cached tokens, block table): none cached / 6 of 13 cached
PREFILL_ROWS = [(9, 0, [1, 3, 5]), (13, 6, [8, 10, 12, 13])]


def _layer(window=W, cap=None):
    return SimpleNamespace(num_heads=H, num_kv_heads=H_KV, head_size=D, scale=SCALE,
                           sliding_window=window, logits_soft_cap=cap)  # fmt: skip


def _reference(q, k, v, q_pos, window, cap):
    """q [n, H, D] at positions q_pos, keys/values [L, H_KV, D] of positions 0..L-1 ->
    [n, H, D] in float64, one query and head at a time."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    group = H // H_KV
    for i, p in enumerate(q_pos):
        lo = 0 if window is None else max(0, p - window + 1)
        for h in range(H):
            keys = k[lo : p + 1, h // group].double()  # [seen, D]
            scores = keys @ q[i, h].double() * SCALE  # [seen]
            if cap is not None:
                scores = torch.tanh(scores / cap) * cap
            out[i, h] = torch.softmax(scores, 0) @ v[lo : p + 1, h // group].double()
    return out


def _kv(g, n):
    return torch.randn(n, H_KV, D, generator=g), torch.randn(n, H_KV, D, generator=g)


def _slots(table, positions):
    return [table[p // BS] * BS + p % BS for p in positions]


def _decode_case(put):
    """Cached keys for every row's earlier positions (``put(slot, k, v)``); returns the step,
    the new tokens' q/k/v [rows, H(_KV) * D] and the reference [rows, H, D]."""
    g = torch.Generator().manual_seed(0)
    qs, ks, vs, want = [], [], [], []
    for n, table in DECODE_ROWS:
        k, v = _kv(g, n)
        q = torch.randn(1, H, D, generator=g)
        for p, slot in enumerate(_slots(table, range(n - 1))):
            put(slot, k[p], v[p])
        qs.append(q)
        ks.append(k[n - 1 :])
        vs.append(v[n - 1 :])
        want.append((q, k, v, [n - 1]))
    step = StepInputs(
        ForwardMode.DECODE,
        [n for n, _ in DECODE_ROWS],
        [1] * len(DECODE_ROWS),
        [t for _, t in DECODE_ROWS],
        [_slots(t, [n - 1])[0] for n, t in DECODE_ROWS],
        len(DECODE_ROWS),
    )
    flat = lambda xs: torch.cat(xs).reshape(len(xs), -1)  # noqa: E731
    return step, flat(qs), flat(ks), flat(vs), want


def _prefill_case(put):
    g = torch.Generator().manual_seed(1)
    qs, ks, vs, want, slots = [], [], [], [], []
    for n, c, table in PREFILL_ROWS:
        k, v = _kv(g, n)
        q = torch.randn(n - c, H, D, generator=g)
        for p, slot in enumerate(_slots(table, range(c))):
            put(slot, k[p], v[p])
        qs.append(q)
        ks.append(k[c:])
        vs.append(v[c:])
        slots += _slots(table, range(c, n))
        want.append((q, k, v, list(range(c, n))))
    step = StepInputs(ForwardMode.PREFILL, [n for n, _, _ in PREFILL_ROWS],
                      [n - c for n, c, _ in PREFILL_ROWS], [t for _, _, t in PREFILL_ROWS],
                      slots, len(PREFILL_ROWS))  # fmt: skip
    flat = lambda xs: torch.cat(xs).reshape(sum(x.shape[0] for x in xs), -1)  # noqa: E731
    return step, flat(qs), flat(ks), flat(vs), want


def _expected(want, window, cap):
    return torch.cat([_reference(q, k, v, pos, window, cap) for q, k, v, pos in want]).float()


def _sdpa_cache():
    cache = torch.zeros(2, NUM_BLOCKS + 1, BS, H_KV, D)

    def put(slot, k, v):
        cache[0].view(-1, H_KV, D)[slot] = k
        cache[1].view(-1, H_KV, D)[slot] = v

    return cache, put


def _spec(**kw):
    return AttentionSpec(H, H_KV, D, BS, torch.float32, torch.device("cpu"), **kw)


@pytest.mark.parametrize("cap", [None, 2.0])
@pytest.mark.parametrize("case", ["decode", "prefill"])
def test_torch_sdpa_window_equals_reference(case, cap):
    """Decode rows of 3, 5 and 14 tokens and prefills (one over 6 cached tokens) with a
    5-token window, with and without a score cap: equal to the reference, and different
    from full attention (so the window is what makes them equal)."""
    from vllm.attention.backends.torch_sdpa import TorchSDPABackend

    backend = TorchSDPABackend(_spec())
    cache, put = _sdpa_cache()
    step, q, k, v, want = (_decode_case if case == "decode" else _prefill_case)(put)
    md = backend.build_metadata(step, NUM_BLOCKS * BS)
    out = md.impl.forward(_layer(W, cap), q, k, v, cache, md).view(-1, H, D)
    torch.testing.assert_close(out, _expected(want, W, cap), atol=1e-5, rtol=1e-5)
    full = _expected(want, None, cap)
    assert not torch.allclose(out, full, atol=1e-3), "the window changed nothing"


def _flashinfer(**spec_kw):
    from vllm.attention.backends.flashinfer.flashinfer import FlashInferBackend

    return FlashInferBackend(_spec(**spec_kw), FakePrefillWrapper, FakeDecodeWrapper)


def _fi_cache():
    cache = torch.zeros(NUM_BLOCKS + 1, 2, BS, H_KV, D)

    def put(slot, k, v):
        cache[slot // BS, 0, slot % BS] = k
        cache[slot // BS, 1, slot % BS] = v

    return cache, put


@pytest.mark.parametrize("case", ["decode", "prefill"])
def test_flashinfer_plans_a_wrapper_per_window(case):
    """Eager FLASHINFER: the windowed layer runs a wrapper planned with window_left = W - 1
    (and the model's softmax scale), the full layer one planned with -1; both outputs equal
    the reference. The small-decode kernel (no window) is bypassed."""
    backend = _flashinfer(sliding_windows=(W,), scale=SCALE, small_decode_max_rows=8)
    assert backend.small_max_rows == 0
    cache, put = _fi_cache()
    step, q, k, v, want = (_decode_case if case == "decode" else _prefill_case)(put)
    md = backend.build_metadata(step, NUM_BLOCKS * BS)
    assert md.wrapper.window_left == -1 and md.window_wrappers[W].window_left == W - 1
    assert md.window_wrappers[W].sm_scale == SCALE
    windowed = md.impl.forward(_layer(W), q, k, v, cache, md).view(-1, H, D)
    torch.testing.assert_close(windowed, _expected(want, W, None), atol=1e-5, rtol=1e-5)
    full = md.impl.forward(_layer(None), q, k, v, cache, md).view(-1, H, D)
    torch.testing.assert_close(full, _expected(want, None, None), atol=1e-5, rtol=1e-5)


def test_flashinfer_graph_state_plans_each_window_per_replay():
    """The graph state of a windowed model gives each captured size one wrapper per window
    over the same buffers; a replay plans both, and the windowed layer equals the reference."""
    backend = _flashinfer(sliding_windows=(W,), scale=SCALE)
    state = backend.make_graph_state(NUM_BLOCKS * BS)
    state.allocate(4)
    md = state.metadata_for_capture(4)
    cache, put = _fi_cache()
    step, q, k, v, want = _decode_case(put)
    rows = len(DECODE_ROWS)
    pad = 4 - rows  # one padded lane
    step = StepInputs(
        ForwardMode.DECODE,
        step.seq_lens + [0] * pad,
        [1] * 4,
        step.block_tables + [[]] * pad,
        step.slot_mapping + [-1] * pad,
        rows,
    )
    state.prepare_replay(4, step, md)
    assert md.window_wrappers[W].indptr is md.wrapper.indptr  # the size's own views
    assert md.window_wrappers[W].window_left == W - 1 and md.wrapper.window_left == -1
    zeros = torch.zeros(pad, H * D)
    out = md.impl.forward(_layer(W), torch.cat([q, zeros]), torch.cat([k, zeros[:, : H_KV * D]]),
                          torch.cat([v, zeros[:, : H_KV * D]]), cache, md)  # fmt: skip
    got = out.view(-1, H, D)[:rows]
    torch.testing.assert_close(got, _expected(want, W, None), atol=1e-5, rtol=1e-5)
