"""Every new family on one GPU in bfloat16 (marked ``gpu``; skipped without CUDA).

docs/design.md: vs transformers in bf16 -> check_logprobs_close; CUDA graphs vs
--enforce-eager with the same backend and batch composition (eager batches padded to the
captured sizes) -> exact. FLASHINFER must actually have run its prefill and decode wrappers.
The checkpoints are the CPU tiny models with head_dim 64 or 128 (sizes FlashInfer has).
"""

import pytest

from tests.utils import check_logprobs_close, check_outputs_equal, hf_greedy, vllm_greedy

pytestmark = pytest.mark.gpu

PROMPTS = ["Hello world", "The capital of France is", "a b c d e f", "Paris"]
HD64 = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1)
# DeepSeek's latent attention: one KV head per query head; q / k heads of 48 + 16 = 64
MLA64 = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=2,
             qk_nope_head_dim=48, qk_rope_head_dim=16)  # fmt: skip


def _phi3_hd64():
    import tiny_models

    params = dict(tiny_models.tiny_phi3_config().rope_parameters)
    params["short_factor"] = [1.0 + 0.05 * i for i in range(32)]
    params["long_factor"] = [1.0 + 0.2 * i for i in range(32)]
    return tiny_models.tiny_phi3_config(rope_parameters=params, **HD64)


def _phi4_mini_hd64():
    """Phi-4-mini's partial rotary (0.75: 48 of 64 channels) with LongRoPE lists of 24."""
    import tiny_models

    params = dict(tiny_models.tiny_phi4_mini_config().rope_parameters)
    params["short_factor"] = [1.0 + 0.05 * i for i in range(24)]
    params["long_factor"] = [1.0 + 0.2 * i for i in range(24)]
    return tiny_models.tiny_phi4_mini_config(rope_parameters=params, **HD64)


BUILDERS = {
    "qwen3": lambda tm: tm.tiny_qwen3_config(),  # head_dim 128 already
    "mistral": lambda tm: tm.tiny_mistral_config(**HD64),
    "phi3": lambda tm: _phi3_hd64(),
    "phi4_mini": lambda tm: _phi4_mini_hd64(),
    # Dense routing (every expert on every token) for the comparison with transformers: with
    # top-2 of 8, bf16 rounding flips the expert choice wherever two router logits nearly tie
    # (scaling the router does not help: the rounding is relative), and one flip moves the
    # output beyond any top-5 check (on these weights transformers in bf16 already departs
    # that way from transformers in float32). Sparse routing: graph against eager, below.
    "qwen3_moe": lambda tm: tm.tiny_qwen3_moe_config(head_dim=64, num_experts_per_tok=8, **HD64),
    "mixtral": lambda tm: tm.tiny_mixtral_config(num_experts_per_tok=8, **HD64),
    "qwen2_moe": lambda tm: tm.tiny_qwen2_moe_config(num_experts_per_tok=8, **HD64),
    "gemma3": lambda tm: tm.tiny_gemma3_config(),  # head_dim 64, sliding window 8
    # attention scores soft-capped at 2.0: FlashInfer's logits_soft_cap in its plans
    "gemma2": lambda tm: tm.tiny_gemma2_config(),
    # softmax scale 1 / head_dim, as Granite 3.x: FlashInfer must plan with it
    "granite": lambda tm: tm.tiny_granite_config(attention_multiplier=1 / 64, **HD64),
    "smollm3": lambda tm: tm.tiny_smollm3_config(**HD64),  # NoPE layers 1 and 3
    # post-norm layers, q/k norms over all heads (plain torch norms)
    "olmo2": lambda tm: tm.tiny_olmo2_config(**HD64),
    "olmo3": lambda tm: tm.tiny_olmo3_config(**HD64),  # 3 sliding layers (window 8), 1 global
    # four norms per layer; half of each head rotating as interleaved pairs (torch rotary)
    "glm4": lambda tm: tm.tiny_glm4_config(head_dim=64, **HD64),
    # dense routing as the MoE families above: one group, every expert (the float32 router
    # and the shared expert still run; the correction bias picks nothing when all are picked)
    "glm4_moe": lambda tm: tm.tiny_glm4_moe_config(
        head_dim=64, n_group=1, topk_group=1, num_experts_per_tok=8, **HD64
    ),
    # multi-head latent attention with heads of 64 (FlashInfer's size): V2's q / k heads
    # of 48 + 16 rotary channels with value heads of 16 zero-padded to 64, YaRN with
    # mscale_all_dim; V3's value heads of 64 (no padding), interleaved rotary. Dense routing
    # as the MoE families above (V2: greedy softmax; V3: one group)
    "deepseek_v2": lambda tm: tm.tiny_deepseek_v2_config(
        topk_method="greedy", n_group=1, topk_group=1, num_experts_per_tok=8, **MLA64
    ),
    "deepseek_v3": lambda tm: tm.tiny_deepseek_v3_config(
        n_group=1, topk_group=1, num_experts_per_tok=8, v_head_dim=64, **MLA64
    ),
    # YaRN past a 16-position original context (the prompts and 32 tokens reach ~40)
    "qwen2_yarn": lambda tm: tm.tiny_qwen2_config(
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 1e6,
            "factor": 4.0,
            "original_max_position_embeddings": 16,
        },
        max_position_embeddings=16,
        **HD64,
    ),
}
SPARSE_MOE = {  # top-2 of 8, uneven routing: the expert kernel's grouping in graphs
    "qwen3_moe": lambda tm: tm.tiny_qwen3_moe_config(head_dim=64, **HD64),
    "mixtral": lambda tm: tm.tiny_mixtral_config(**HD64),
    "qwen2_moe": lambda tm: tm.tiny_qwen2_moe_config(**HD64),  # and its shared expert
    # grouped sigmoid routing (2 of 4 groups) with a random correction bias
    "glm4_moe": lambda tm: tm.tiny_glm4_moe_config(head_dim=64, **HD64),
    # group-limited softmax (2 of 4 groups) and grouped sigmoid routing with a random bias
    "deepseek_v2": lambda tm: tm.tiny_deepseek_v2_config(**MLA64),
    "deepseek_v3": lambda tm: tm.tiny_deepseek_v3_config(v_head_dim=64, **MLA64),
}


def _save(builder, name: str, tmp_path_factory) -> str:
    import tiny_models

    out = tmp_path_factory.mktemp(f"{name}_gpu")
    # Gemma and Granite are saved with their own embedding std (see tiny_models)
    embed_std = {"gemma2": tiny_models.GEMMA3_EMBED_STD, "gemma3": tiny_models.GEMMA3_EMBED_STD,
                 "granite": tiny_models.GRANITE_EMBED_STD}.get(name)  # fmt: skip
    if name.startswith(("glm4_moe", "deepseek_v3")):  # with a random routing correction bias
        return tiny_models.save_tiny_glm4_moe_checkpoint(builder(tiny_models), str(out), seed=11)
    return tiny_models.save_tiny_hf_checkpoint(
        builder(tiny_models), str(out), seed=11, embed_std=embed_std
    )


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def family_dir(request, tmp_path_factory):
    return _save(BUILDERS[request.param], request.param, tmp_path_factory)


@pytest.fixture(scope="module", params=sorted(SPARSE_MOE))
def sparse_moe_dir(request, tmp_path_factory):
    return _save(SPARSE_MOE[request.param], f"{request.param}_sparse", tmp_path_factory)


def _llm(model, **kw):
    import os

    os.environ["VLLM_ATTENTION_BACKEND"] = "FLASHINFER"
    from vllm import LLM

    kw.setdefault("small_decode_max_rows", 0)
    return LLM(model=model, device="cuda", dtype="bfloat16", gpu_memory_utilization=0.3,
               max_num_seqs=8, **kw)  # fmt: skip


@pytest.mark.forked
def test_family_graphs_close_to_transformers_and_equal_to_eager(family_dir):
    """FLASHINFER with graphs: logprobs-close to transformers; decode graphs replayed; the
    same batches --enforce-eager (padded alike) give identical tokens (for the MoE families
    this is the Triton expert kernel in a graph vs eagerly)."""
    # transformers' eager attention: its sdpa path drops Gemma 2's attention soft-cap on
    # CUDA (transformers 5.17), which made the reference, not the engine, wrong
    ref = hf_greedy(family_dir, PROMPTS, 32, dtype="bfloat16", device="cuda",
                    attn_implementation="eager")  # fmt: skip
    graph, eager = _graph_then_eager(family_dir)
    check_logprobs_close(ref, graph, "hf", "vllm-flashinfer-graphs", PROMPTS)
    check_outputs_equal(graph, eager, "graph", "eager")


def _graph_then_eager(model: str):
    """Greedy top-5 outputs of PROMPTS with graphs, then --enforce-eager with the eager
    batches padded to the captured sizes; asserts that FlashInfer's prefill and decode
    wrappers ran and that decode graphs were replayed."""
    llm = _llm(model)
    be = llm.llm_engine.executor.worker.model_runner.attn_backend
    start = (be.prefill_runs, be.decode_runs)
    ours = vllm_greedy(llm, PROMPTS, 32, logprobs=5)
    assert be.prefill_runs > start[0] and be.decode_runs > start[1]
    counters = llm.llm_engine.decode_step_counters()
    assert sum(counters["graph"][0].values()) > 0, counters
    llm.llm_engine.shutdown()
    del llm
    eager = _llm(model, enforce_eager=True)
    eager.llm_engine.executor.worker.model_runner.pad_eager_batches = True
    return ours, vllm_greedy(eager, PROMPTS, 32, logprobs=5)


@pytest.mark.forked
def test_sparse_moe_graphs_equal_eager(sparse_moe_dir):
    """Top-2 of 8 experts: the Triton expert kernel replayed in decode graphs gives the same
    tokens and logprobs as the same kernel run eagerly on the same padded batches."""
    graph, eager = _graph_then_eager(sparse_moe_dir)
    check_outputs_equal(graph, eager, "graph", "eager")


@pytest.mark.forked
@pytest.mark.parametrize("family", ["phi4_mini", "glm4"])
def test_partial_rotary_small_decode_close_to_transformers(family, tmp_path_factory):
    """Phi-4-mini's partial rotary and GLM-4's partial interleaved one through the one-row
    small-decode kernel (the rotary module runs first, the decode kernel rotates nothing):
    each prompt alone, graphs and eager, logprobs-close to transformers and graphs equal to
    eager."""
    model = _save(BUILDERS[family], f"{family}_small", tmp_path_factory)
    ref = hf_greedy(model, PROMPTS[:2], 32, dtype="bfloat16", device="cuda")
    outs = {}
    for eager in (False, True):
        llm = _llm(model, enforce_eager=eager, small_decode_max_rows=1)
        outs[eager] = [vllm_greedy(llm, [p], 32, logprobs=5)[0] for p in PROMPTS[:2]]
        llm.llm_engine.shutdown()
        del llm
    check_logprobs_close(ref, outs[False], "hf", "vllm-small-decode", PROMPTS[:2])
    check_outputs_equal(outs[False], outs[True], "graph", "eager")
