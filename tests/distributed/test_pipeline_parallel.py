"""Pipeline parallelism on two GPUs (mp executor, NCCL): PP=2 vs PP=1.

docs/design.md rules: float32 on TORCH_SDPA (TF32 off) is exact, PP vs not; 16-bit FLASHINFER
with several virtual engines changes batch shapes, so bfloat16 runs are compared with
check_logprobs_close. With CUDA graphs on, both stages must have replayed graphs (docs/design.md
guarantee 5), counted by each stage's graph runner. Skipped without 2 GPUs.
"""

import pytest

from tests.utils import check_logprobs_close, check_outputs_equal, vllm_greedy

PROMPTS = [
    "The capital of France is",
    "Hi",
    "Write a long story about a dragon who lived in a mountain and guarded gold for many "
    "centuries, until one day a young girl came to visit",
    "def fibonacci(n):",
    "1, 2, 3, 4,",
    "List three colors and explain why each of them is important in painting:",
    "Once upon a time,",
    "The quick brown fox",
]
BATCH_SIZES = (1, 2, 3, 5, 8, 16)
MAX_TOKENS = 32
# Pairwise over model x backend x {graphs, eager} (pairwise, not the full product):
# every pair of values of two factors appears in some case. The tiny model under FlashInfer
# has head_dim 64: FlashInfer has no kernels for tiny_llama_dir's 16 (the selector refuses it).
CASES = [
    ("smollm2_gguf", "FLASHINFER", False),
    ("smollm2_gguf", "TORCH_SDPA", True),
    ("tiny_llama_hd64_dir", "FLASHINFER", True),
    ("tiny_llama_dir", "TORCH_SDPA", False),
]


def _batches():
    return [[PROMPTS[(i * 3) % len(PROMPTS)] for i in range(n)] for n in BATCH_SIZES]


def _graph_replays(snapshot: dict) -> int:
    return sum(sum(sizes.values()) for sizes in snapshot.get("graph", {}).values())


def _run(model, pp, backend, enforce_eager, logprobs):
    from vllm import LLM

    llm = LLM(
        model=model,
        device="cuda",
        dtype="bfloat16" if backend == "FLASHINFER" else "float32",
        pipeline_parallel_size=pp,
        enforce_eager=enforce_eager,
        gpu_memory_utilization=0.4,
        # Prefill graphs are PP = 1 only: with them, PP = 1 would pad one-prompt prefills to
        # a graph size and PP = 2 would not, a different batch composition on one side
        # (TESTING.md). Graph vs padded eager is proven by test_cuda_graphs_gpu's
        # test_prefill_graphs; here both sides prefill unpadded.
        prefill_graph_max_tokens=0,
    )
    engine = llm.llm_engine
    try:
        outs = [vllm_greedy(llm, batch, MAX_TOKENS, logprobs=logprobs) for batch in _batches()]
        counters = engine.decode_step_counters()
        per_stage = counters if pp > 1 else {0: counters}
        if pp > 1:
            names = engine.executor.collective_rpc("attn_backend_name")
            assert names == [backend] * pp, names
            assert engine.max_steps_in_flight == pp
        if not enforce_eager:
            for rank, snap in per_stage.items():
                assert _graph_replays(snap) > 0, f"stage {rank} replayed no graph: {snap}"
        return outs
    finally:
        engine.shutdown()


@pytest.mark.multi_gpu(2)
@pytest.mark.forked
@pytest.mark.parametrize("model_fixture, backend, enforce_eager", CASES)
def test_pp2_matches_pp1(model_fixture, backend, enforce_eager, request, monkeypatch):
    model = request.getfixturevalue(model_fixture)
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", backend)
    exact = backend == "TORCH_SDPA"  # float32; FLASHINFER has no float32 kernels
    logprobs = None if exact else 5
    ref = _run(model, 1, backend, enforce_eager, logprobs)
    out = _run(model, 2, backend, enforce_eager, logprobs)
    for batch, r, o in zip(_batches(), ref, out):
        assert all(len(ids) > 0 for ids, _, _ in o), "a request produced nothing"
        if exact:
            check_outputs_equal(r, o, "pp1", "pp2", batch)
        else:
            check_logprobs_close(r, o, "pp1", "pp2", batch)
