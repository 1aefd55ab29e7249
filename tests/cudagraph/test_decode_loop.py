"""Decode-loop graphs (vllm/cudagraph/decode_loop.py) on CPU: fake graphs (re-run the captured
function, reading the static buffers as a replay does), float32, so every comparison with
one-token eager steps is exact (docs/design.md).

- FLASHINFER's small-decode path (its Triton kernel under ``TRITON_INTERPRET=1``, in a
  subprocess; FlashInfer's wrappers are fakes) advancing itself inside the loop graph;
- batches that do not fit a loop graph (logprobs, penalties, seeds, more than 8 rows) take
  the per-step path, with the same tokens;
- the eligibility rule and the sizes that get a loop graph.
The TORCH_SDPA loop path is in test_multi_step.py::test_multi_step_replays_fake_graphs.
"""

import os

import pytest
import torch

from tests.cudagraph.test_graph_capture import decode_request, make_worker, multi_step_call
from tests.utils import run_interpreted
from vllm.cudagraph.decode_loop import eligible, greedy_metadata
from vllm.cudagraph.sizes import loop_capture_sizes
from vllm.sampling_params import SamplingParams

STEPS = 4


@pytest.fixture(autouse=True)
def _small_cache(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")


def interpreted_flashinfer_small_loop():
    """FLASHINFER with the small-decode path: loop graphs for sizes 1, 2, 4, advancing the
    kernel's lengths on the device; tokens equal one-token eager steps on the same path.
    The interpreter makes every kernel program slow (about 40 ms each), so: a batch limit of 4
    (a size-8 loop graph is the same code with more rows;
    test_batches_above_the_loop_sizes_take_the_step_path captures one on TORCH_SDPA), two
    calls: one row exactly at a size, and three rows padded to 4 (padded lanes inside the
    kernel), each crossing a block boundary; and graphs that serve contexts of at most 48
    tokens. A graph's kernel grid has one program per 16 tokens of that bound (at most 32,
    the default 8192 gives 32): 3 here, which still has rows of one split (15, 16 tokens and
    padded lanes: the program writes the output), of two and three splits (the merge) and
    programs past a row's splits (exit at once), and the longest context with its
    lookahead slots (34) fits."""
    model = os.environ["TINY_LLAMA_DIR"]
    g = make_worker(model, 1, "FLASHINFER", small_rows=8, max_num_seqs=4,
                    num_scheduler_steps=STEPS, max_seq_len_to_capture=48)  # fmt: skip
    e = make_worker(model, 1, "FLASHINFER", capture=False, small_rows=8, max_num_seqs=4)
    loops = g.model_runner.graph_runner.graphs.loops[0]
    assert sorted(loops) == [1, 2, 4]
    greedy = SamplingParams(temperature=0, max_tokens=50)
    for rows, ctx in ((1, 30), (3, 14)):  # lengths 31..34 and 15..18 during the call
        got, want, delta = multi_step_call(g, e, rows, ctx, greedy, STEPS)
        size = g.model_runner.capture_sizes.padded_size(rows)
        assert delta == {size: STEPS}, delta
        assert got == want, (rows, ctx, got, want)
        assert len({t for row in got for t in row}) > 2  # not one repeated token
    be = g.model_runner.attn_backend
    assert be.small_decode_runs > 0 and be.decode_runs == 0


def test_flashinfer_small_loop_interpreted(tiny_llama_dir, monkeypatch):
    monkeypatch.setenv("TINY_LLAMA_DIR", tiny_llama_dir)
    run_interpreted(__file__, "interpreted_flashinfer_small_loop")


@pytest.mark.forked
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0, max_tokens=50, logprobs=2),
        SamplingParams(temperature=0, max_tokens=50, repetition_penalty=0.5),
        SamplingParams(temperature=0.8, seed=5, max_tokens=50),
    ],
    ids=["logprobs", "penalty", "seeded"],
)
def test_ineligible_batches_take_the_step_path(tiny_llama_dir, params):
    """Sampling a loop graph cannot do: the per-step path runs (no loop replay), same tokens."""
    g = make_worker(tiny_llama_dir, 1, max_num_seqs=8, num_scheduler_steps=STEPS)
    e = make_worker(tiny_llama_dir, 1, capture=False, max_num_seqs=8)
    loops = g.model_runner.graph_runner.graphs.loops[0]
    replays = {s: lg.graph.replays for s, lg in loops.items()}
    got, want, delta = multi_step_call(g, e, 3, 14, params, STEPS)
    assert got == want
    assert delta == {4: STEPS}  # the plain graph of size 4, once per step
    assert {s: lg.graph.replays for s, lg in loops.items()} == replays


@pytest.mark.forked
def test_batches_above_the_loop_sizes_take_the_step_path(tiny_llama_dir):
    g = make_worker(tiny_llama_dir, 1, max_num_seqs=16, num_scheduler_steps=STEPS)
    e = make_worker(tiny_llama_dir, 1, capture=False, max_num_seqs=16)
    assert sorted(g.model_runner.graph_runner.graphs.loops[0]) == [1, 2, 4, 8]
    got, want, delta = multi_step_call(
        g, e, 11, 9, SamplingParams(temperature=0, max_tokens=50), STEPS
    )
    assert got == want and delta == {16: STEPS}


def test_more_replays_than_the_ring_raises(tiny_llama_dir):
    """A loop graph's ring holds ``num_scheduler_steps`` rows: a call of one more step is
    refused before any replay (on CUDA its last replay would write past the ring), and a
    call of exactly that many runs."""
    g = make_worker(tiny_llama_dir, 1, max_num_seqs=8, num_scheduler_steps=STEPS)
    runner = g.model_runner
    req = decode_request(2, ctx=9)  # one block each: room for the STEPS - 1 lookahead tokens
    batch = runner.prepare_model_input(
        req.seq_group_metadata_list, 0, g.cache_engines[0].scratch_slot, STEPS - 1
    )
    before = runner.counters.snapshot()["graph"].get(0, {})
    with pytest.raises(ValueError, match=rf"{STEPS + 1} loop steps outside \[1, {STEPS}\]"):
        runner.graph_runner.run_loop(batch, STEPS + 1)
    assert runner.counters.snapshot()["graph"].get(0, {}) == before  # nothing replayed
    with torch.inference_mode():  # as the worker runs it
        ring = runner.graph_runner.run_loop(batch, STEPS)
    assert ring is not None and tuple(ring.shape) == (STEPS, 2, 3)


def test_eligibility_and_sizes():
    sm = greedy_metadata(3, torch.device("cpu"))
    assert eligible(sm)
    for change in (
        dict(all_greedy=False),
        dict(max_logprobs=1),
        dict(penalties=object()),
        dict(prompt_row_ids=torch.zeros(1)),
        dict(generators=[None, torch.Generator(), None]),
    ):
        other = greedy_metadata(3, torch.device("cpu"))
        for k, v in change.items():
            setattr(other, k, v)
        assert not eligible(other), change
    assert loop_capture_sizes((1, 2, 4, 8, 16, 24), 8, 8) == (1, 2, 4, 8)
    assert loop_capture_sizes((1, 2, 4), 8, 8) == (1, 2, 4)
    assert loop_capture_sizes((1, 2, 4, 8), 1, 8) == ()  # no multi-step decoding, no loop graphs
    # CompilationConfig.disable_decode_loop_graphs (--disable-decode-loop-graphs)
    assert loop_capture_sizes((1, 2, 4, 8), 8, 8, disabled=True) == ()
    # the attention backend's loop_max_rows() bounds the sizes
    assert loop_capture_sizes((1, 2, 4, 8, 16, 24), 8, max_rows=16) == (1, 2, 4, 8, 16)
    assert loop_capture_sizes((1, 2, 4, 8), 8, max_rows=1) == (1,)
    assert loop_capture_sizes((1, 2, 4, 8), 8, max_rows=0) == ()


def test_loop_sizes_follow_the_attention_backend(tiny_llama_dir, monkeypatch):
    """TORCH_SDPA advances its graph buffers at every size and loops up to 8 rows;
    FLASHINFER with CUDA-core decode (the tiny model's group size 2) only at its
    small-decode sizes (``--small-decode-max-rows``, 0 with sliding windows); the model
    runner's GraphSpec takes the backend's bound."""
    from tests.attention.test_small_decode import _backend
    from vllm.attention.backends.abstract import AttentionSpec
    from vllm.attention.backends.torch_sdpa import TorchSDPABackend
    from vllm.engine.arg_utils import EngineArgs
    from vllm.worker.model_runner import ModelRunner

    spec = AttentionSpec(4, 2, 16, 16, torch.float32, torch.device("cpu"))
    assert TorchSDPABackend(spec).loop_max_rows() == 8
    assert [_backend(n).loop_max_rows() for n in (0, 1, 8, 64)] == [0, 1, 8, 64]
    cfg = EngineArgs(model=tiny_llama_dir, device="cpu", num_scheduler_steps=8,
                     max_num_seqs=32).create_engine_config()  # fmt: skip
    assert ModelRunner(cfg, torch.device("cpu")).graph_spec.loop_sizes == (1, 2, 4, 8)
    monkeypatch.setattr(TorchSDPABackend, "loop_max_rows", lambda self: 2)
    assert ModelRunner(cfg, torch.device("cpu")).graph_spec.loop_sizes == (1, 2)
