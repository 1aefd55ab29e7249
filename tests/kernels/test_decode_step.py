"""A decode-loop step's bookkeeping kernels (vllm/kernels/decode_step.py).

Reference: the torch ops they replace, run on copies of the same tensors, and the values
must be identical (integer arithmetic and copies only): ``ring.index_copy_`` /
``counter.add_`` / ``ids.copy_`` / ``pos.add_`` of vllm/cudagraph/decode_loop.py, and
``loop_plan.advance_paged``'s torch path over a call of several steps (pages entered
mid-call, padded lanes, the advance past a call's last planned page). CPU: under
``TRITON_INTERPRET=1`` (tests.utils.run_interpreted). GPU (``gpu`` marker): the compiled
kernels, and the dispatch that sends CUDA tensors to them.
"""

import importlib.util

import pytest
import torch

from tests.utils import run_interpreted

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed (pip install -r requirements-test.txt)",
)

BS = 16
SCRATCH = 60 * BS  # the scratch block's first slot


def _finish_cases(device: str) -> None:
    from vllm.kernels import decode_step

    for rows in (1, 3, 8, 200):
        gen = torch.Generator().manual_seed(rows)
        ring = torch.randn(5, rows, 3, generator=gen, dtype=torch.float64).to(device)
        packed = torch.randn(rows, 3, generator=gen, dtype=torch.float64).to(device)
        ids = torch.randint(0, 1000, (rows,), generator=gen).to(device)
        nxt = torch.randint(0, 1000, (rows,), generator=gen).to(device)
        pos = torch.randint(0, 5000, (rows,), generator=gen).to(device)
        for at in (0, 3):
            counter = torch.tensor([at], device=device)
            want = [t.clone() for t in (ring, counter, ids, pos)]
            want[0].index_copy_(0, want[1], packed[None])
            want[1].add_(1)
            want[2].copy_(nxt)
            want[3].add_(1)
            decode_step.finish_step(ring, counter, packed, ids, nxt, pos)
            names = ("ring", "counter", "ids", "pos")
            for got, exp, name in zip((ring, counter, ids, pos), want, names):
                assert torch.equal(got, exp), (rows, at, name)
            assert int(counter) == at + 1  # not vacuous: the counter moved
    with pytest.raises(ValueError, match=r"expected \[steps, rows, W\]"):
        decode_step.finish_step(ring, counter, packed[:, :2], ids, nxt, pos)


def _paged_call(device: str):
    """A loop-planned call of 6 real rows (pages entered at once, mid-call or not) and 2
    padded lanes, as tests/attention/test_flashinfer_loop_plan.py builds it."""
    from vllm.attention.backends.abstract import ForwardMode, StepInputs
    from vllm.attention.backends.flashinfer.loop_plan import first_page_lens, lengthened
    from vllm.attention.backends.flashinfer.paged_cache import paged_kv_host, slot_rows_host

    lens, steps, pad = [1, 14, 16, 17, 30, 100], 9, 2
    tables = [[3 * j + r for j in range(-(-(n + steps - 1) // BS))] for r, n in enumerate(lens)]
    slots = [t[(n - 1) // BS] * BS + (n - 1) % BS for t, n in zip(tables, lens)]
    step = StepInputs(ForwardMode.DECODE, lens + [0] * pad, [1] * (len(lens) + pad),
                      tables + [[] for _ in range(pad)], slots + [-1] * pad,
                      len(lens))  # fmt: skip
    indptr, indices, last = paged_kv_host(lengthened(step, steps - 1, BS), BS, 60)
    last = first_page_lens(last, step.num_real_rows, steps - 1)
    slot_rows = slot_rows_host(step.slot_mapping, SCRATCH, BS)  # [3, rows] int64
    pos = torch.tensor([n - 1 for n in lens] + [0] * pad)
    # slot_rows as a view of a wider buffer, as the graph state holds it
    wide = torch.full((3, 16), -7, dtype=torch.int64)
    wide[:, : slot_rows.shape[1]] = slot_rows
    return [t.to(device) for t in (indptr, indices, last, wide)] + [pos.to(device), steps]


def _advance_cases(device: str) -> None:
    from vllm.attention.backends.flashinfer import loop_plan
    from vllm.kernels import decode_step

    indptr, indices, last, wide, pos, steps = _paged_call(device)
    rows = last.shape[0]
    ref_last, ref_wide, ref_pos = last.clone(), wide.clone(), pos.clone()
    seen = set()
    for i in range(steps):  # one advance past the call's last planned step too
        pos += 1
        ref_pos += 1
        decode_step.advance_paged(indptr, indices, last, wide[:, :rows], pos, SCRATCH, BS)
        ref = ref_wide[:, :rows].cpu()  # the torch ops (CPU tensors take them)
        ref_last_cpu = ref_last.cpu()
        loop_plan.advance_paged(indptr.cpu(), indices.cpu(), ref_last_cpu, ref, ref_pos.cpu(),
                                SCRATCH, BS)  # fmt: skip
        assert torch.equal(last.cpu(), ref_last_cpu), i
        assert torch.equal(wide[:, :rows].cpu(), ref), i
        ref_last.copy_(ref_last_cpu)
        ref_wide[:, :rows].copy_(ref)
        seen.update(wide[0, :6].tolist())
    assert torch.equal(wide[:, rows:].cpu(), torch.full((3, 16 - rows), -7)), "past the rows"
    assert (wide[0, 6:rows] == SCRATCH).all()  # padded lanes stay on the scratch slot
    assert len(seen) > 6 * (steps - 1)  # the slots moved every step
    with pytest.raises(ValueError, match="expected"):
        decode_step.advance_paged(indptr, indices, last, wide[:2, :rows], pos, SCRATCH, BS)


def _check_interpreted() -> None:
    _finish_cases("cpu")
    _advance_cases("cpu")


def test_interpreted():
    run_interpreted(__file__, "_check_interpreted")


def test_cpu_tensors_keep_the_torch_ops():
    from vllm.kernels.dispatch import get_triton_decode_step

    assert get_triton_decode_step(torch.zeros(2, dtype=torch.long)) is None


@pytest.mark.gpu
def test_cuda_kernels():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from vllm.kernels import decode_step
    from vllm.kernels.dispatch import get_triton_decode_step

    assert get_triton_decode_step(torch.zeros(2, dtype=torch.long, device="cuda")) is decode_step
    _finish_cases("cuda")
    _advance_cases("cuda")
