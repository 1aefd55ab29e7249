"""EngineArgs: the single source of the CLI flags and of ``LLM(**kwargs)``.

Each dataclass field becomes a ``--kebab-case`` flag (bools become store-true flags, lists
take several values); the field's ``help`` metadata is the flag's help text.
``create_engine_config`` builds and validates an :class:`~vllm.config.EngineConfig`
without touching any weight.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import numbers
import types
import typing
from dataclasses import dataclass, field

from vllm import envs
from vllm.attention.kv_cache_dtype import KV_CACHE_DTYPES
from vllm.config import (
    CacheConfig,
    CompilationConfig,
    DecodingConfig,
    DeviceConfig,
    EngineConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    parse_json_object,
)
from vllm.engine.compat_args import (
    check_compat_args,
    check_lora_switches,
    check_upstream_lora_flags,
    check_upstream_switches,
)
from vllm.engine.speculative_args import resolve_speculative
from vllm.engine.upstream_flags import check_upstream_flags, log_ignored_code_revision
from vllm.lora.config import LoRAConfig
from vllm.model_executor.models import architectures_of, get_model_class, is_headless
from vllm.pooling.config import resolve_pooler
from vllm.sampling_params import LOGPROBS_MODES

logger = logging.getLogger(__name__)


def _f(default, help: str, group: str | None = None, choices: tuple | None = None, const=None):
    """A field whose flag has ``help`` and sits in ``--help`` group ``group`` (None: the
    general options); ``choices``, when given, are the only values the flag accepts
    (argparse refuses others; the config refuses them from ``LLM(**kwargs)``); ``const``,
    when given, is the value of the flag written without one (``--hf-token``)."""
    meta = {"help": help, "group": group, "choices": choices, "const": const}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


# Upstream's other spellings of some flags: short ones (``vllm serve M -tp 2``, ``-O3``,
# ``-dp 1``) and upstream's current names of flags this engine has under an older one.
FLAG_ALIASES = {
    "tensor_parallel_size": ("-tp",),
    "pipeline_parallel_size": ("-pp",),
    "quantization": ("-q",),
    "compilation_config": ("-O", "-cc", "--optimization-level"),
    "cuda_graph_sizes": ("--cudagraph-capture-sizes",),
    "data_parallel_size": ("-dp",),
    "data_parallel_rank": ("-dpn",),
    "data_parallel_start_rank": ("-dpr",),
    "data_parallel_size_local": ("-dpl",),
    "data_parallel_address": ("-dpa",),
    "data_parallel_rpc_port": ("-dpp",),
    "data_parallel_backend": ("-dpb",),
    "data_parallel_hybrid_lb": ("-dph",),
    "data_parallel_external_lb": ("-dpe",),
    "enable_expert_parallel": ("-ep",),
}

# --piecewise-graph-max-tokens when not given and chunked prefill runs on one CUDA device.
PIECEWISE_CHUNKED_DEFAULT = 512

# Bool flags off by default that upstream V0 spelled with an optional value (``--flag
# false``; bare ``--flag`` is true): a --flag / --no-flag pair like the flags on by default,
# whose --flag also takes that value (FlexibleArgumentParser, vllm/utils/argparse_utils.py).
VALUE_BOOL_FLAGS = ("multi_step_stream_outputs", "enable_chunked_prefill")

# The flag groups of ``--help``, in order (upstream groups flags by the config they fill).
GROUPS = {
    "model": "The model, its weights, dtype, device and context length.",
    "cache": "The paged KV cache.",
    "scheduler": "Batching limits of each scheduler step.",
    "parallel": "Pipeline stages and the executor that runs them.",
    "speculative": "Speculative decoding (a draft model or n-gram prompt lookup).",
    "lora": "LoRA adapters served beside the base model.",
    "compilation": "CUDA graphs and the Triton decode paths (no effect on CPU).",
    "structured outputs": "Guided decoding (JSON schema, regex, choice, grammar).",
    "observability": "Engine statistics.",
    "upstream": "Upstream flags for features this engine lacks: accepted at the values "
    "that change nothing here, refused at any other.",
}


@dataclass
class EngineArgs:
    """Arguments of an engine, with upstream vLLM's names and defaults."""

    model: str = _f("", "Hugging Face directory or .gguf file of the model.", group="model")
    tokenizer: str | None = _f(None, "Tokenizer path (default: the model's own).", group="model")
    skip_tokenizer_init: bool = _f(
        False, "Do not load a tokenizer; prompts must be token ids.", group="model"
    )
    tokenizer_mode: str = _f(
        "auto", "auto (the fast tokenizer when there is one; hf, upstream's name for the "
        "Hugging Face tokenizer, is the same here) or slow; mistral and custom are refused.",
        group="model",
    )  # fmt: skip
    trust_remote_code: bool = _f(
        False,
        "Let transformers run the config's and the tokenizer's own code from the model "
        "directory (auto_map); model classes are always this engine's.",
        group="model",
    )
    revision: str | None = _f(
        None, "Branch, tag or commit of a model named by Hugging Face Hub repository "
        "(default: main); logged as ignored for a local path.", group="model",
    )  # fmt: skip
    download_dir: str | None = _f(
        None, "Hugging Face Hub cache directory for a model named by repository (default: "
        "HF_HUB_CACHE / HF_HOME's); logged as ignored for a local path.", group="model",
    )  # fmt: skip
    hf_token: str | bool | None = _f(
        None, "Token for the Hugging Face Hub when a model or tokenizer is named by repository "
        "(gated or private ones), as upstream: the token itself, or the flag alone (True) "
        "for the one `hf auth login` stored. (default: HF_TOKEN or the stored one)",
        group="model", const=True,
    )  # fmt: skip
    tokenizer_revision: str | None = _f(
        None, "Branch, tag or commit of a tokenizer named by Hub repository; logged as "
        "ignored otherwise (the tokenizer is the model's files).", group="model",
    )  # fmt: skip
    disable_sliding_window: bool = _f(
        False, "Cap max_model_len at the model's smallest sliding window, as upstream "
        "(within it sliding-window attention is full attention); no change for models "
        "without one.", group="model",
    )  # fmt: skip
    cpu_offload_gb: float = _f(
        0.0, "GiB of weights kept in CPU memory (upstream); only 0.", group="cache"
    )
    calculate_kv_scales: bool = _f(
        False, "Compute an 8-bit KV cache's scales from the first batch (upstream); not "
        "supported: the cache uses the checkpoint's k_scale / v_scale, or scale 1.",
        group="cache",
    )  # fmt: skip
    preemption_mode: str | None = _f(
        None, "How preempted requests resume: recompute (the only mode; None means it too).",
        group="scheduler",
    )  # fmt: skip
    disable_custom_all_reduce: bool = _f(
        False, "Accepted for upstream scripts; tensor parallelism always uses "
        "torch.distributed's all-reduce (NCCL on CUDA), so it changes nothing.",
        group="parallel",
    )  # fmt: skip
    max_parallel_loading_workers: int | None = _f(
        None, "Accepted for upstream scripts (its limit on ranks loading weights at once); "
        "ignored: each rank reads only its own layers and shard, in its own process.",
        group="parallel",
    )  # fmt: skip
    compilation_config: str | dict | None = _f(
        None, "Upstream's torch.compile settings (JSON or a level); accepted and ignored: "
        "this engine does not compile the model (CUDA graphs: --enforce-eager, "
        "--cuda-graph-sizes, --max-cudagraph-capture-size).", group="compilation",
    )  # fmt: skip
    quantization: str | None = _f(
        None,
        "None (the checkpoint's weights as stored; an fp8 checkpoint's quantization_config "
        "is followed, block-wise and mixture-of-experts ones dequantized on load, as GPTQ "
        "and AWQ checkpoints are), fp8 (the "
        "decoder's projections quantized to float8_e4m3fn on load, one scale per output row; "
        "the embedding, lm_head and MoE experts keep the model's dtype), compressed-tensors / "
        "fbgemm_fp8 (naming an fp8 checkpoint's format; compressed-tensors also names one "
        "that quantizes only the KV cache, whose weights load as stored), gptq / awq (naming "
        "a GPTQ or AWQ checkpoint's format, which loads dequantized to the model's dtype "
        "anyway) or gguf (a .gguf file; implied by one).",
        group="model",
    )
    task: str = _f(
        "auto", "What the model does: auto (generate), generate, or embed (a pooling model).",
        group="model",
    )  # fmt: skip
    runner: str = _f(
        "auto", "The model runner: auto, generate, or pooling (the same as --task embed).",
        group="model",
    )  # fmt: skip
    convert: str = _f(
        "auto", "Upstream's model conversion: auto or none (the model as --task / --runner "
        "say, generation by default), or embed (serve it as an embedding model, the same "
        "as --task embed); classify and reward are refused.", group="model",
    )  # fmt: skip
    override_pooler_config: str | dict | None = _f(
        None,
        'Pooler of --task embed as JSON: {"pooling_type": "LAST"|"MEAN"|"CLS", '
        '"normalize": true|false} (default LAST, normalized).',
        group="model",
    )
    pooler_config: str | dict | None = _f(
        None, "Upstream's newer name of --override-pooler-config (give one of them).",
        group="model",
    )  # fmt: skip
    enable_lora: bool = _f(
        False, "Serve LoRA adapters (PEFT directories) beside the base model.", group="lora"
    )
    max_loras: int = _f(1, "LoRA adapters one step may use (device slots).", group="lora")
    max_lora_rank: int = _f(16, "Largest LoRA rank r served.", group="lora")
    max_cpu_loras: int | None = _f(
        None, "LoRA adapters kept read on the host (default: max_loras).", group="lora"
    )
    lora_dtype: str = _f(
        "auto", "dtype of the adapters' weights on the device (upstream): auto, the model's "
        "dtype, is the only one; naming the model's dtype is accepted too.", group="lora",
    )  # fmt: skip
    fully_sharded_loras: bool = _f(
        False, "Accepted for upstream scripts; under tensor parallelism each rank already "
        "holds its cut of every adapter, so it changes nothing.", group="lora",
    )  # fmt: skip
    lora_extra_vocab_size: int = _f(
        256, "Upstream's extra vocabulary rows per adapter (deprecated there); accepted "
        "and ignored (another value is logged): adapters add no vocabulary here.",
        group="lora",
    )  # fmt: skip
    long_lora_scaling_factors: list[float] | None = _f(
        None, "Upstream's long-context LoRA scaling factors; not supported (refused when "
        "given).", group="lora",
    )  # fmt: skip
    dtype: str = _f(
        "auto",
        "Weights and activations: auto (bfloat16 on CUDA, float32 on CPU), float32, "
        "float16, bfloat16.",
        group="model",
    )
    seed: int = _f(
        0, "Random seed of weights init (dummy) and of unseeded sampling.", group="model"
    )
    max_model_len: int | None = _f(
        None,
        "Context length (prompt + output tokens), e.g. 4096, 4k (4000) or 4K (4096); "
        "default: the model's max_position_embeddings (times the factor of a linear RoPE "
        "scaling; with yarn, original_max_position_embeddings times the factor; as upstream "
        "derives it).",
        group="model",
    )
    max_logprobs: int = _f(
        20,
        "Most log probabilities a request may ask for per position (logprobs, "
        "prompt_logprobs; OpenAI's top_logprobs limit); -1: up to the vocabulary size.",
        group="model",
    )
    logprobs_mode: str = _f(
        LOGPROBS_MODES[0],
        "What the logprobs of sampled positions report: raw_logprobs (the model's "
        "log-probabilities, before logit_bias, allowed_token_ids, bad_words, penalties, "
        "min_tokens, structured outputs, temperature and top-k/top-p/min-p), "
        "processed_logprobs (those of the logits the token is drawn from, after all of "
        "them; a greedy row's at temperature 1, unfiltered), or raw_logits / "
        "processed_logits (the same logits without the log_softmax). Prompt logprobs are "
        "raw logprobs in every mode.",
        group="model",
        choices=LOGPROBS_MODES,
    )
    generation_config: str = _f(
        "auto",
        "Where generation_config.json comes from: auto (the model directory, when it has "
        "one), vllm (ignore it) or a directory. Its eos_token_id list stops sequences and "
        "its temperature, top_p, top_k, min_p, repetition_penalty and max_new_tokens are "
        "the defaults of requests that leave them out.",
        group="model",
    )
    override_generation_config: str | dict | None = _f(
        None,
        "Generation-config fields as a JSON object, e.g. '{\"temperature\": 0.5}' "
        "(temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens): they "
        "replace or add to the file's defaults (also with --generation-config vllm).",
        group="model",
    )
    hf_overrides: str | dict | None = _f(
        None,
        "Hugging Face config attributes to set as a JSON object, e.g. "
        "'{\"max_position_embeddings\": 8192}' (a nested object updates a sub-config).",
        group="model",
    )
    hf_config_path: str | None = _f(
        None,
        "Hugging Face directory to read the model's config from instead of --model (for a "
        ".gguf file: the original model's directory, when transformers cannot convert the "
        "file's metadata); the weights still come from --model.",
        group="model",
    )
    load_format: str = _f(
        "auto",
        "auto (gguf for a .gguf file, else safetensors), safetensors, gguf, or dummy "
        "(random weights, for benchmarks) or sim (the pipeline simulator's waiting stand-in).",
        group="model",
    )
    model_loader_extra_config: str | None = _f(
        None,
        "Options of the load format as a JSON object, e.g. '{\"step_ms\": 8}' for sim.",
        group="model",
    )
    device: str = _f("auto", "auto (cuda when available, else cpu), cuda or cpu.", group="model")
    attention_backend: str | None = _f(
        None,
        "The attention backend, as upstream's flag: FLASHINFER or TORCH_SDPA (any case); "
        "upstream's other backends are refused, naming these. Wins over the "
        "VLLM_ATTENTION_BACKEND variable. (default: FLASHINFER on CUDA for float16/bfloat16 "
        "when it is installed and supports the head size, else TORCH_SDPA)",
        group="model",
    )
    enforce_eager: bool = _f(False, "Never capture CUDA graphs.", group="model")
    max_seq_len_to_capture: int = _f(
        8192,
        "Longest context a captured graph serves (capped at --max-model-len); longer "
        "decode batches run eagerly.",
        group="model",
    )
    block_size: int = _f(16, "Tokens per KV-cache block.", group="cache")
    kv_cache_dtype: str = _f(
        "auto",
        "The KV cache's storage dtype: auto (the model's dtype), fp8 / fp8_e4m3 or fp8_e5m2 "
        "(8-bit floats: twice the tokens of a 16-bit cache; keys and values divided by the "
        "checkpoint's per-layer k_scale / v_scale, 1.0 where it has none).",
        group="cache",
        choices=tuple(KV_CACHE_DTYPES),
    )
    swap_space: float = _f(
        4.0,
        "CPU swap space per GPU in GiB (upstream V0); accepted, none is allocated: "
        "preempted sequences are recomputed.",
        group="cache",
    )
    gpu_memory_utilization: float = _f(
        0.9,
        "Fraction of GPU memory this engine may use (weights, activations, KV cache); "
        "other processes' memory is not charged to it, so engines at 0.3 each share a GPU.",
        group="cache",
    )
    num_gpu_blocks_override: int | None = _f(
        None,
        "Fixed KV-cache block count per stage, split over its virtual engines, all usable "
        "(the scratch block each virtual engine keeps comes on top), as upstream (testing; "
        "default: sized by profiling on CUDA, by VLLM_CPU_KVCACHE_SPACE on CPU).",
        group="cache",
    )
    kv_cache_memory_bytes: int | None = _f(
        None,
        "KV-cache bytes per GPU (per stage and tensor-parallel rank; on CPU too), as "
        "upstream: an integer or a size such as 20G (2**30 bytes) or 20g (10**9). When set, "
        "gpu_memory_utilization (and VLLM_CPU_KVCACHE_SPACE on CPU) no longer size the "
        "cache; --num-gpu-blocks-override still wins. (default: unset)",
        group="cache",
    )
    enable_prefix_caching: bool = _f(
        True,
        "Reuse the cached KV blocks of shared prompt prefixes (automatic prefix caching; "
        "default on, --no-enable-prefix-caching turns it off).",
        group="cache",
    )
    prefix_caching_hash_algo: str = _f(
        "sha256",
        "How prefix-cache blocks are identified: sha256 (upstream's default), a "
        "cryptographic hash, so no prompt can be built to collide with another's blocks.",
        group="cache",
        choices=("sha256",),
    )
    prefix_routing_margin: int = _f(
        4,
        "With several virtual engines and prefix caching: the most extra unfinished "
        "requests a virtual engine may have over the least loaded one and still get a "
        "request whose prefix it caches.",
        group="cache",
    )
    guided_decoding_backend: str = _f(
        "xgrammar",
        "Structured outputs (JSON schema, regex, choice, grammar): the backend; only xgrammar.",
        group="structured outputs",
    )
    structured_outputs_config: str | dict | None = _f(
        None,
        "Upstream's structured-outputs settings as a JSON object: 'backend' (xgrammar or "
        "auto) sets --guided-decoding-backend; 'disable_any_whitespace' (true: JSON "
        "constraints allow no free whitespace); 'enable_in_reasoning' (with "
        "--reasoning-parser; false, the default: a reply's reasoning is unconstrained and "
        "the constraint holds after it; true: from the first token); 'disable_fallback' "
        "is accepted; other keys or values are refused.",
        group="structured outputs",
    )
    max_num_seqs: int = _f(256, "Most sequences in one step.", group="scheduler")
    max_num_batched_tokens: int | None = _f(
        None,
        "Most tokens in one step, the per-step token budget (default: max(max_model_len, "
        "2048); 2048 with --enable-chunked-prefill).",
        group="scheduler",
    )
    enable_chunked_prefill: bool = _f(
        False,
        "Chunked prefill: each step runs the running decodes first, then prefill chunks in "
        "the rest of the token budget; prompts may be longer than the budget (default off).",
        group="scheduler",
    )
    max_num_partial_prefills: int = _f(
        1,
        "With --enable-chunked-prefill (needed above 1): the most requests whose prefill is "
        "partly done at once.",
        group="scheduler",
    )
    scheduling_policy: str = _f(
        "fcfs",
        "fcfs (first come, first served) or priority (by each request's priority, lower "
        "first, then arrival; a waiting request preempts running ones of lower priority "
        "when it does not fit).",
        group="scheduler",
    )
    num_scheduler_steps: int = _f(
        1,
        "Decode forward passes per scheduler call (multi-step decoding; 1 = off).",
        group="scheduler",
    )
    multi_step_stream_outputs: bool = _f(
        True, "Upstream V0's switch, accepted as --multi-step-stream-outputs [true|false]: "
        "here a multi-step call's tokens reach streams together when the call ends, whatever "
        "the value (upstream's false).", group="scheduler",
    )  # fmt: skip
    pipeline_parallel_size: int = _f(1, "Pipeline stages (one device each).", group="parallel")
    tensor_parallel_size: int = _f(
        1, "Tensor-parallel ranks per pipeline stage (one device each).", group="parallel"
    )
    distributed_executor_backend: str | None = _f(
        None,
        "uni, mp or ray (default: uni for one stage, mp for several).",
        group="parallel",
    )
    speculative_config: str | dict | None = _f(
        None,
        "Speculative decoding as one JSON object, upstream's flag: "
        '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4} or '
        '{"model": DRAFT, "num_speculative_tokens": 4} (a dict from Python); the same as '
        "the separate flags below, which it must not repeat.",
        group="speculative",
    )
    speculative_model: str | None = _f(
        None,
        "Draft model path, or '[ngram]' for prompt lookup (default: none, no speculation).",
        group="speculative",
    )
    num_speculative_tokens: int | None = _f(
        None,
        "Tokens proposed per step, k >= 1 (default: none; needed with --speculative-model).",
        group="speculative",
    )
    ngram_prompt_lookup_max: int | None = _f(
        None,
        "Longest n-gram looked up (default: none; needed with '[ngram]').",
        group="speculative",
    )
    ngram_prompt_lookup_min: int | None = _f(
        None, "Shortest n-gram looked up (default: 1).", group="speculative"
    )
    speculative_max_model_len: int | None = _f(
        None,
        "The draft's context limit (default: the smaller of the draft's and the target's).",
        group="speculative",
    )
    speculative_disable_by_batch_size: int | None = _f(
        None,
        "Skip speculation in steps with at least this many running requests (default: "
        "never skipped).",
        group="speculative",
    )
    speculative_draft_tensor_parallel_size: int | None = _f(
        None,
        "Tensor-parallel size of the draft model: the target's (the default; the draft is "
        "sharded over the same ranks).",
        group="speculative",
    )
    max_cudagraph_capture_size: int = _f(
        512, "Largest captured CUDA-graph decode batch size.", group="compilation"
    )
    cuda_graph_sizes: list[int] | None = _f(
        None,
        "Explicit CUDA-graph decode batch sizes (default: the capture-size rule's list up "
        "to --max-cudagraph-capture-size).",
        group="compilation",
    )
    prefill_graph_max_tokens: int = _f(
        512,
        "Longest one-prompt prefill (tokens) replayed from a CUDA graph; 0 = none.",
        group="compilation",
    )
    piecewise_graph_max_tokens: int | None = _f(
        None,
        "Most tokens of a prefill or mixed step replayed from piecewise CUDA graphs "
        "(projections and MLP captured per layer, attention eager); 0 = none (default: "
        "512 with --enable-chunked-prefill on CUDA at one pipeline stage and one "
        "tensor-parallel rank, else 0).",
        group="compilation",
    )
    disable_decode_loop_graphs: bool = _f(
        False,
        "With --num-scheduler-steps > 1, do not capture decode-loop graphs.",
        group="compilation",
    )
    small_decode_max_rows: int = _f(
        1,
        "Most decode rows on FLASHINFER's Triton small-decode path; 0 = off, max 64.",
        group="compilation",
    )
    disable_async_output_proc: bool = _f(
        False,
        "Detokenize each step's outputs before the next step starts, not while the device "
        "runs it (overlapped by default on one CUDA device without speculative decoding).",
        group="scheduler",
    )
    disable_log_stats: bool = _f(False, "Do not log engine statistics.", group="observability")
    # Upstream flags for features this engine does not have: each is accepted at the
    # values that change nothing here and refused at the others (vllm/engine/upstream_flags.py).
    data_parallel_size: int = _f(
        1, "Upstream's data-parallel engine replicas: 1 only (one engine per server; run a "
        "server per replica behind a load balancer).", group="upstream",
    )  # fmt: skip
    data_parallel_size_local: int | None = _f(
        None, "Upstream's data-parallel replicas on this node: unset or 1.", group="upstream"
    )
    data_parallel_rank: int | None = _f(
        None, "Upstream's data-parallel rank of this server: unset or 0.", group="upstream"
    )
    data_parallel_start_rank: int | None = _f(
        None, "Upstream's first data-parallel rank of this node: unset or 0.", group="upstream"
    )
    data_parallel_address: str | None = _f(
        None, "Upstream's data-parallel head-node address: unset only.", group="upstream"
    )
    data_parallel_rpc_port: int | None = _f(
        None, "Upstream's data-parallel RPC port: unset only.", group="upstream"
    )
    data_parallel_backend: str = _f(
        "mp", "Upstream's data-parallel launcher: mp only (no replicas are launched).",
        group="upstream",
    )  # fmt: skip
    data_parallel_hybrid_lb: bool = _f(
        False, "Upstream's hybrid data-parallel load balancing: refused when on.",
        group="upstream",
    )  # fmt: skip
    data_parallel_external_lb: bool = _f(
        False, "Upstream's external data-parallel load balancing: refused when on.",
        group="upstream",
    )  # fmt: skip
    enable_expert_parallel: bool = _f(
        False, "Upstream's expert parallelism: refused when on (with tensor parallelism "
        "every rank holds its slice of every expert).", group="upstream",
    )  # fmt: skip
    enable_eplb: bool = _f(
        False, "Upstream's expert-parallel load balancing: refused when on.", group="upstream"
    )
    async_scheduling: bool | None = _f(
        None, "Upstream's asynchronous scheduling: --no-async-scheduling is what this engine "
        "does (a step is scheduled once the previous step's tokens are applied); "
        "--async-scheduling is refused. (default: unset, meaning off)", group="upstream",
    )  # fmt: skip
    enable_sleep_mode: bool = _f(
        False, "Upstream's sleep mode (weights and KV cache freed on demand): refused when on.",
        group="upstream",
    )  # fmt: skip
    worker_cls: str = _f(
        "auto", "Upstream's worker class: auto only (this engine's own workers).",
        group="upstream",
    )  # fmt: skip
    worker_extension_cls: str = _f(
        "", "Upstream's worker extension class: empty only (none is mixed in). (default: "
        "empty)",
        group="upstream",
    )  # fmt: skip
    model_impl: str = _f(
        "auto", "Upstream's model implementation: auto or vllm (this engine's model classes, "
        "the only ones); transformers is refused.", group="upstream",
    )  # fmt: skip
    code_revision: str | None = _f(
        None, "Upstream's hub revision of the model's code; logged as ignored (models are "
        "local paths).", group="upstream",
    )  # fmt: skip
    disable_cascade_attn: bool = _f(
        False, "Upstream's switch against cascade attention; either value is accepted and "
        "changes nothing: there is no cascade attention here.", group="upstream",
    )  # fmt: skip
    disable_hybrid_kv_cache_manager: bool | None = _f(
        None, "Upstream's switch against its hybrid KV cache manager: on is what this engine "
        "does (every layer gets the same cache); --no-disable-hybrid-kv-cache-manager is "
        "refused. (default: unset, meaning on)", group="upstream",
    )  # fmt: skip
    kv_transfer_config: str | dict | None = _f(
        None, "Upstream's KV transfer connector (disaggregated prefill, LMCache): unset only.",
        group="upstream",
    )  # fmt: skip
    kv_events_config: str | dict | None = _f(
        None, "Upstream's KV-cache event publishing: unset only.", group="upstream"
    )
    otlp_traces_endpoint: str | None = _f(
        None, "Upstream's OpenTelemetry traces endpoint: unset only (no tracing).",
        group="upstream",
    )  # fmt: skip
    enable_prompt_embeds: bool = _f(
        False, "Upstream's prompt-embeddings input: refused when on.", group="upstream"
    )
    limit_mm_per_prompt: str | dict | None = _f(
        None, "Upstream's multimodal items per prompt, as JSON: only 0 for every modality, "
        "e.g. '{\"image\": 0}' (text models only).", group="upstream",
    )  # fmt: skip
    stream_interval: int = _f(
        1, "Upstream's tokens per streamed chunk: 1 only (each step's new tokens are sent "
        "when the step ends).", group="upstream",
    )  # fmt: skip

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Add one flag per field to ``parser`` (``--max-num-seqs`` for ``max_num_seqs``),
        each in its :data:`GROUPS` argument group (``parser.flag_groups`` maps a group
        name to its argparse group, so callers can add flags to them); returns ``parser``.

        ``--model`` is added only when ``parser`` has no argument storing ``model`` yet:
        ``vllm serve`` declares a positional MODEL first, the benchmark scripts their own
        ``--model`` with a default; a bare parser (upstream's example scripts:
        ``EngineArgs.add_cli_args(FlexibleArgumentParser())``) gets ``--model``."""
        hints = typing.get_type_hints(cls)
        groups = getattr(parser, "flag_groups", None)
        if groups is None:
            groups = {name: parser.add_argument_group(f"{name} options", desc)
                      for name, desc in GROUPS.items()}  # fmt: skip
            parser.flag_groups = groups
        for f in dataclasses.fields(cls):
            if f.name == "model" and any(a.dest == "model" for a in parser._actions):
                continue  # declared by the caller (vllm serve's positional MODEL)
            flags = ["--" + f.name.replace("_", "-")]  # first: argparse's dest comes from it
            flags += [alias for alias in FLAG_ALIASES.get(f.name, ())
                      if alias not in parser._option_string_actions]  # fmt: skip
            kind, optional = _base_type(hints[f.name])
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            help_text = f.metadata.get("help", "")
            target = groups.get(f.metadata.get("group"), parser)
            negatable = (default is not False or f.name in VALUE_BOOL_FLAGS
                         or f.metadata.get("group") == "upstream")  # fmt: skip
            if kind is bool and negatable:
                # on or unset (None) by default, an upstream V0 switch that took a value, or
                # an upstream switch (upstream spells every switch with a --no- form):
                # --no-<flag> turns it off, and so does --<flag> false (FlexibleArgumentParser)
                target.add_argument(*flags, action=argparse.BooleanOptionalAction,
                                    default=default, help=help_text)  # fmt: skip
            elif kind is bool:
                target.add_argument(*flags, action="store_true", default=default, help=help_text)
            elif kind is list:
                target.add_argument(*flags, type=_list_item_type(hints[f.name]), nargs="+",
                                    default=default, help=help_text)  # fmt: skip
            elif f.metadata.get("const") is not None:
                target.add_argument(*flags, type=kind, nargs="?", const=f.metadata["const"],
                                    default=default, help=help_text)  # fmt: skip
            else:
                parse = human_readable_int if f.name in HUMAN_READABLE else kind
                target.add_argument(*flags, type=parse, default=default, help=help_text,
                                    choices=f.metadata.get("choices"))  # fmt: skip
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineArgs:
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{n: getattr(args, n) for n in names if hasattr(args, n)})

    def _piecewise_graph_max_tokens(self, device: str) -> int:
        """The flag's value, or its default when not given: 512 (the prefill graphs'
        default ceiling) for chunked prefill with CUDA graphs on one CUDA device (PP = 1,
        TP = 1; the setting measured in docs/benchmarks.md "Piecewise graphs on an H200"),
        else 0."""
        if self.piecewise_graph_max_tokens is not None:
            return self.piecewise_graph_max_tokens
        on = (self.enable_chunked_prefill and device == "cuda" and not self.enforce_eager
              and self.pipeline_parallel_size == 1 and self.tensor_parallel_size == 1)  # fmt: skip
        return PIECEWISE_CHUNKED_DEFAULT if on else 0

    def _check_types(self) -> None:
        """Normalize what upstream also accepts (``seed=None`` -> 0, a torch.dtype ->
        its name), then check each field's type, so a wrong one is a ValueError naming the
        field rather than a TypeError deep inside.

        Raises:
            ValueError: a field of the wrong type (an int field given "128" or 2.5, ...).
        """
        if self.seed is None:
            self.seed = 0
        if type(self.dtype).__name__ == "dtype" and str(self.dtype).startswith("torch."):
            self.dtype = str(self.dtype).removeprefix("torch.")
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            kinds = [a for a in typing.get_args(hints[f.name]) if a is not type(None)]
            if len(kinds) > 1:  # several types (a JSON string or a dict): checked where read
                continue
            kind, optional = _base_type(hints[f.name])
            value = getattr(self, f.name)
            if value is None and optional:
                continue
            if kind is int:
                ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
                if ok:
                    setattr(self, f.name, int(value))
            elif kind is float:
                ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
            elif kind is bool:
                ok = isinstance(value, numbers.Integral) and value in (0, 1)  # bools too
                if ok:
                    setattr(self, f.name, bool(value))
            elif kind is list and isinstance(value, tuple):  # upstream passes tuples too
                ok = True
                setattr(self, f.name, list(value))
            elif kind in (str, list):
                ok = isinstance(value, kind)
            else:
                continue
            if not ok:
                raise ValueError(
                    f"{f.name} must be {'an' if kind is int else 'a'} {kind.__name__}"
                    f"{' or None' if optional else ''}, got {value!r} ({type(value).__name__})."
                )

    def create_engine_config(self) -> EngineConfig:
        """Build and validate every config; raises ValueError naming the bad value."""
        self._check_types()
        if not self.model:
            raise ValueError(
                "model must be given (a Hugging Face directory or Hub repository, or a .gguf file)."
            )
        from vllm.transformers_utils.hub import resolve_model_path

        model = resolve_model_path(
            self.model, self.revision, self.download_dir, token=self.hf_token
        )
        tokenizer = self.tokenizer
        if tokenizer and tokenizer != self.model:
            tokenizer = resolve_model_path(
                tokenizer, self.tokenizer_revision, self.download_dir, "tokenizer", self.hf_token
            )
        elif tokenizer:
            tokenizer = model
        check_compat_args(model, self.tokenizer_mode, self.quantization, self.swap_space)
        used = self.tokenizer and tokenizer not in (self.tokenizer, model)  # fetched at it
        check_upstream_switches(
            model, None if used else self.tokenizer_revision, self.cpu_offload_gb,
            self.preemption_mode,
            self.disable_custom_all_reduce, self.compilation_config,
            self.max_parallel_loading_workers, self.calculate_kv_scales,
        )  # fmt: skip
        check_upstream_lora_flags(self.lora_extra_vocab_size, self.long_lora_scaling_factors)
        check_upstream_flags(self)
        log_ignored_code_revision(model, self.code_revision)
        device_config = DeviceConfig(self.device, self.attention_backend)
        parallel_config = ParallelConfig(
            pipeline_parallel_size=self.pipeline_parallel_size,
            tensor_parallel_size=self.tensor_parallel_size,
            distributed_executor_backend=self.distributed_executor_backend,
            cpu_threads=envs.OMP_NUM_THREADS,
        )
        cache_config = CacheConfig(
            block_size=self.block_size,
            gpu_memory_utilization=self.gpu_memory_utilization,
            num_gpu_blocks_override=self.num_gpu_blocks_override,
            kv_cache_memory_bytes=self.kv_cache_memory_bytes,
            enable_prefix_caching=self.enable_prefix_caching,
            prefix_caching_hash_algo=self.prefix_caching_hash_algo,
            prefix_routing_margin=self.prefix_routing_margin,
            cache_dtype=self.kv_cache_dtype,
        )
        compilation_config = CompilationConfig(
            enforce_eager=self.enforce_eager,
            max_cudagraph_capture_size=self.max_cudagraph_capture_size,
            cuda_graph_sizes=self.cuda_graph_sizes,
            max_seq_len_to_capture=self.max_seq_len_to_capture,
            prefill_graph_max_tokens=self.prefill_graph_max_tokens,
            disable_decode_loop_graphs=self.disable_decode_loop_graphs,
            small_decode_max_rows=self.small_decode_max_rows,
            piecewise_graph_max_tokens=self._piecewise_graph_max_tokens(device_config.device),
        )
        model_config = ModelConfig(
            model=model,
            tokenizer=tokenizer,
            dtype=self.dtype,
            seed=self.seed,
            max_model_len=self.max_model_len,
            max_logprobs=self.max_logprobs,
            logprobs_mode=self.logprobs_mode,
            generation_config=self.generation_config,
            override_generation_config=self.override_generation_config,
            hf_overrides=self.hf_overrides,
            hf_config_path=self.hf_config_path,
            disable_sliding_window=self.disable_sliding_window,
            load_format=self.load_format,
            quantization=None if self.quantization == "gguf" else self.quantization,
            skip_tokenizer_init=self.skip_tokenizer_init,
            tokenizer_mode="auto" if self.tokenizer_mode == "hf" else self.tokenizer_mode,
            trust_remote_code=self.trust_remote_code,
            device=device_config.device,
            model_loader_extra_config=self.model_loader_extra_config,
        )
        _log_kv_scales(model_config, cache_config)
        pooler_config = resolve_pooler(
            self.task, self.runner, self._pooler_overrides(),
            headless=is_headless(model_config.hf_config), convert=self.convert,
            model=model_config.model,
        )  # fmt: skip
        spec = resolve_speculative(self)  # --speculative-config applied
        speculative_config = SpeculativeConfig.create(
            model_config,
            parallel_config,
            spec["speculative_model"],
            spec["num_speculative_tokens"],
            spec["ngram_prompt_lookup_max"],
            spec["ngram_prompt_lookup_min"],
            spec["speculative_max_model_len"],
            spec["speculative_disable_by_batch_size"],
            spec["speculative_draft_tensor_parallel_size"],
        )
        model_config.use_async_output_proc = _async_output_proc(
            self.disable_async_output_proc,
            device_config.device,
            parallel_config,
            speculative_config,
        )
        if self.num_scheduler_steps > 1:
            _check_multi_step(self.num_scheduler_steps, speculative_config, parallel_config)
        scheduler_config = SchedulerConfig(
            max_model_len=model_config.max_model_len,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            num_lookahead_slots=(
                self.num_scheduler_steps - 1
                if speculative_config is None
                else speculative_config.num_speculative_tokens
            ),
            num_scheduler_steps=self.num_scheduler_steps,
            enable_chunked_prefill=self.enable_chunked_prefill,
            max_num_partial_prefills=self.max_num_partial_prefills,
            policy=self.scheduling_policy,
        )
        _check_pooling(pooler_config, self, speculative_config, parallel_config, cache_config)
        return EngineConfig(
            pooler_config=pooler_config,
            lora_config=self._lora_config(speculative_config, model_config),
            speculative_config=speculative_config,
            model_config=model_config,
            cache_config=cache_config,
            parallel_config=parallel_config,
            scheduler_config=scheduler_config,
            device_config=device_config,
            compilation_config=compilation_config,
            decoding_config=DecodingConfig(
                self._guided_backend(),
                self._structured_outputs().get("disable_any_whitespace", False),
                self._structured_outputs().get("enable_in_reasoning", False),
            ),
        )

    # Keys of upstream's StructuredOutputsConfig this engine accepts, with the values it
    # implements (None: any value).
    _STRUCTURED_OUTPUTS_KEYS = {
        "backend": None,
        "disable_any_whitespace": (True, False),
        "disable_fallback": None,
        "enable_in_reasoning": (True, False),
    }

    def _guided_backend(self) -> str:
        """The ``backend`` of ``structured_outputs_config`` when it names one, else
        ``guided_decoding_backend`` (a bad backend is DecodingConfig's error)."""
        return self._structured_outputs().get("backend", self.guided_decoding_backend)

    def _structured_outputs(self) -> dict:
        """``structured_outputs_config`` as a dict (empty when not given).

        Raises:
            ValueError: not a JSON object, a key other than
                :attr:`_STRUCTURED_OUTPUTS_KEYS`, a value other than those this engine
                implements.
        """
        cfg = parse_json_object("structured_outputs_config", self.structured_outputs_config)
        for key, value in (cfg or {}).items():
            if key not in self._STRUCTURED_OUTPUTS_KEYS:
                raise ValueError(
                    f"structured_outputs_config key {key!r} is not supported; supported: "
                    f"{sorted(self._STRUCTURED_OUTPUTS_KEYS)}."
                )
            want = self._STRUCTURED_OUTPUTS_KEYS[key]
            allowed = want if isinstance(want, tuple) else (want,)
            if want is not None and not any(value is v for v in allowed):
                raise ValueError(
                    f"structured_outputs_config {key}={value!r} is not supported: this "
                    f"engine implements only {key}={want!r}."
                )
        return cfg or {}

    def _pooler_overrides(self) -> dict | None:
        """``--override-pooler-config`` or its newer name ``--pooler-config`` as a dict.

        Raises:
            ValueError: both given, or one that is not a JSON object.
        """
        old, new = self.override_pooler_config, self.pooler_config
        if old is not None and new is not None:
            raise ValueError("give override_pooler_config or pooler_config, not both.")
        name = "pooler_config" if new is not None else "override_pooler_config"
        return parse_json_object(name, new if new is not None else old)

    def _lora_config(self, spec, model_config) -> LoRAConfig | None:
        """The LoRAConfig with ``enable_lora``, else None (LoRA flags then ignored).

        Raises:
            ValueError: with speculative decoding, for an architecture with no layer an
                adapter can target here (an empty ``lora_target_modules``: DeepSeek's
                latent attention), or a ``lora_dtype`` other than ``auto`` / the model
                dtype's name.
        """
        if not self.enable_lora:
            return None
        if spec is not None:
            raise ValueError(
                "enable_lora=True cannot be combined with speculative decoding "
                f"(speculative_model={spec.speculative_model!r}); use one or the other."
            )
        archs = architectures_of(model_config.hf_config)
        if not get_model_class(archs).lora_target_modules:
            raise ValueError(
                f"enable_lora=True: {archs[0]} has no layer LoRA adapters can target in "
                "this engine; serve it without --enable-lora."
            )
        check_lora_switches(self.lora_dtype, model_config.dtype, self.fully_sharded_loras)
        return LoRAConfig(self.max_loras, self.max_lora_rank, self.max_cpu_loras)


def _check_pooling(pooler, args, spec, parallel: ParallelConfig, cache) -> None:
    """Refuse what an embedding engine cannot run; turn prefix caching off for poolers
    that read every prompt token (their hidden states must all be computed).

    Raises:
        ValueError: with speculative decoding, pipeline_parallel_size > 1, or chunked
            prefill with a MEAN / CLS pooler.
    """
    if pooler is None:
        return
    if spec is not None:
        raise ValueError("task='embed' cannot be combined with speculative decoding.")
    if parallel.pipeline_parallel_size > 1:
        raise ValueError(
            f"task='embed' runs at pipeline_parallel_size=1, got {parallel.pipeline_parallel_size}."
        )
    if pooler.needs_whole_prompt:
        if args.enable_chunked_prefill:
            raise ValueError(
                f"pooling_type={pooler.pooling_type!r} reads every prompt token and cannot be "
                "combined with enable_chunked_prefill=True; use pooling_type 'LAST'."
            )
        cache.enable_prefix_caching = False


def _log_kv_scales(model_config, cache_config) -> None:
    """Say, once before anything starts, what happens to the KV-cache scales a checkpoint
    declares (``kv_cache_scheme``): an 8-bit KV cache (``--kv-cache-dtype fp8``) stores keys
    and values divided by each layer's ``k_scale`` / ``v_scale`` and attention multiplies
    them back, as upstream; ``auto`` keeps the model's dtype and leaves them unused."""
    from vllm.model_executor.layers.fp8_checkpoint import kv_cache_scheme

    if model_config.load_format == "gguf":
        return
    if kv_cache_scheme(model_config.hf_config, model_config.model) is None:
        return
    if cache_config.cache_dtype == "auto":
        logger.info(
            "%r declares KV-cache scales (kv_cache_scheme in its quantization_config); they "
            "are unused: the KV cache keeps the model's dtype (--kv-cache-dtype auto; an fp8 "
            "cache would apply them).",
            model_config.model,
        )
        return
    logger.info(
        "%r declares KV-cache scales (kv_cache_scheme in its quantization_config); they are "
        "applied: the %s KV cache (--kv-cache-dtype %s) stores keys and values divided by "
        "each layer's k_scale / v_scale, and attention multiplies them back.",
        model_config.model,
        cache_config.cache_dtype,
        cache_config.cache_dtype,
    )


def _async_output_proc(disabled: bool, device: str, parallel: ParallelConfig, spec) -> bool:
    """Whether ``LLMEngine.step`` overlaps output processing with the next step: unless
    disabled, on CUDA (on the CPU the model runs in the calling thread, so there is nothing
    to overlap with) with the in-process executor (one device) and without speculative
    decoding (whose worker reads the device several times per step); upstream V0 has the
    same limits."""
    return (
        not disabled
        and device == "cuda"
        and parallel.distributed_executor_backend == "uni"
        and spec is None
    )


def _check_multi_step(steps: int, spec, parallel: ParallelConfig) -> None:
    """Refuse combinations multi-step decoding does not support (before any weight load).

    Raises:
        ValueError: with speculative decoding, or tensor_parallel_size > 1 together with
            pipeline_parallel_size > 1.
    """
    if spec is not None:
        raise ValueError(
            f"num_scheduler_steps={steps} cannot be combined with speculative decoding "
            f"(speculative_model={spec.speculative_model!r}); use one or the other."
        )
    if parallel.tensor_parallel_size > 1 and parallel.pipeline_parallel_size > 1:
        raise ValueError(
            f"num_scheduler_steps={steps} is not supported with tensor_parallel_size="
            f"{parallel.tensor_parallel_size} and pipeline_parallel_size="
            f"{parallel.pipeline_parallel_size} together; use num_scheduler_steps=1 or one "
            "kind of parallelism."
        )


_SUFFIXES = {
    "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
    "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40,
}  # fmt: skip
# Flags read by human_readable_int, as upstream.
HUMAN_READABLE = ("max_model_len", "kv_cache_memory_bytes")


def human_readable_int(text: str) -> int:
    """``--max-model-len`` and ``--kv-cache-memory-bytes`` as upstream reads them: an
    integer, or a number with a suffix, lower case for powers of 10 (``1k`` = 1000,
    ``25.6k`` = 25600, ``20g`` = 20 * 10**9), upper case for powers of 2 (``1K`` = 1024,
    ``128K`` = 131072, ``20G`` = 20 * 2**30).

    Raises:
        argparse.ArgumentTypeError: anything else, or a fraction of a token.
    """
    text = text.strip()
    try:
        if text and text[-1] in _SUFFIXES:
            value = float(text[:-1]) * _SUFFIXES[text[-1]]
            if value != int(value):
                raise ValueError
            return int(value)
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid value {text!r}: expected an integer such as 4096, 4k (4000) or 4K (4096)"
        ) from None


def _list_item_type(hint) -> type:
    """The item type of a ``list[X]`` or ``list[X] | None`` hint (the flag's ``type``)."""
    for arg in (hint, *typing.get_args(hint)):
        if typing.get_origin(arg) is list:
            return typing.get_args(arg)[0]
    raise TypeError(f"not a list type: {hint!r}")


def _base_type(hint) -> tuple[type, bool]:
    """(int|str|float|bool|list, optional?) for a field's type hint."""
    args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        kind, _ = _base_type(inner[0])
        return kind, True
    if origin is list:
        return list, False
    return hint, False


@dataclass
class AsyncEngineArgs(EngineArgs):
    """Arguments of an :class:`~vllm.engine.async_llm_engine.AsyncLLMEngine` (upstream's
    name): the same fields as :class:`EngineArgs`; the server's own options (host, port,
    request logging) live in ``vllm serve``'s parser."""
