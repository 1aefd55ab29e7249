"""Upstream spellings that existing scripts use: the deprecated ``prompt_token_ids=`` of
``LLM.generate``, ``LLMEngine``'s config accessors, switches accepted only with the value
this engine implements, and ``python -m vllm.entrypoints.openai.api_server``."""

import subprocess
import sys

import pytest

from tests.utils import run_cli


@pytest.mark.forked
def test_prompt_token_ids_keyword_and_engine_accessors(tiny_llama_dir):
    from vllm import LLM, SamplingParams

    llm = LLM(tiny_llama_dir, device="cpu", max_model_len=128)
    sp = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    ids = [[1, 5, 9, 22], [1, 300, 41]]
    new = llm.generate([{"prompt_token_ids": i} for i in ids], sp, use_tqdm=False)
    old = llm.generate(prompt_token_ids=ids, sampling_params=sp, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in old] == [o.outputs[0].token_ids for o in new]
    one = llm.generate(prompt_token_ids=ids[0], sampling_params=sp, use_tqdm=False)
    assert one[0].outputs[0].token_ids == new[0].outputs[0].token_ids
    with pytest.raises(ValueError, match="give prompts or prompt_token_ids, not both"):
        llm.generate("hi", prompt_token_ids=ids)
    engine = llm.llm_engine
    assert engine.get_model_config() is engine.model_config
    assert engine.get_scheduler_config() is engine.scheduler_config
    assert engine.get_parallel_config() is engine.parallel_config is engine.config.parallel_config
    assert engine.cache_config is engine.vllm_config.cache_config
    assert engine.get_decoding_config() is engine.config.decoding_config
    assert engine.get_lora_config() is None
    engine.shutdown()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(cpu_offload_gb=2), r"cpu_offload_gb=2 is not supported; only 0"),
        (dict(preemption_mode="swap"), r"preemption_mode='swap' is not supported"),
        (
            dict(long_lora_scaling_factors=(4.0,)),
            r"long_lora_scaling_factors=\[4.0\] \(--long-lora-scaling-factors\) is not supported",
        ),
        (dict(lora_extra_vocab_size=-1), r"lora_extra_vocab_size must be >= 0, got -1"),
    ],
)
def test_switches_with_one_supported_value(tiny_llama_dir, kwargs, match):
    from vllm.engine.arg_utils import EngineArgs

    with pytest.raises(ValueError, match=match):
        EngineArgs(model=tiny_llama_dir, device="cpu", **kwargs).create_engine_config()


def test_disable_sliding_window_caps_the_context_at_the_window(
    tiny_gemma3_dir, tiny_mistral_dir, tiny_llama_dir
):
    """``disable_sliding_window`` (``--disable-sliding-window``) caps max_model_len at the
    model's smallest sliding window, as upstream, and changes nothing for a model without
    one or one whose every layer has it (capped anyway); it was refused for every model."""
    from vllm.engine.arg_utils import EngineArgs

    def max_len(model, **kw):
        config = EngineArgs(model=model, device="cpu", **kw).create_engine_config()
        return config.model_config.max_model_len

    assert max_len(tiny_gemma3_dir) == 512  # sliding (8), sliding, global layers
    assert max_len(tiny_gemma3_dir, disable_sliding_window=True) == 8
    assert max_len(tiny_gemma3_dir, disable_sliding_window=True, max_model_len=6) == 6
    with pytest.raises(
        ValueError,
        match=r"max_model_len=16 is greater than the model's sliding_window=8: "
        r"disable_sliding_window caps the context at the smallest window",
    ):
        max_len(tiny_gemma3_dir, disable_sliding_window=True, max_model_len=16)
    assert max_len(tiny_mistral_dir, disable_sliding_window=True) == 256
    assert max_len(tiny_mistral_dir) == 256
    assert max_len(tiny_llama_dir, disable_sliding_window=True) == max_len(tiny_llama_dir) == 512
    from vllm.entrypoints.cli import make_parser
    from vllm.entrypoints.openai.server_args import validate_server_args

    args = make_parser().parse_args(["serve", tiny_gemma3_dir, "--disable-sliding-window"])
    assert validate_server_args(args).disable_sliding_window is True


def test_accepted_upstream_serve_flags(tiny_llama_dir, caplog):
    from vllm.entrypoints.cli import make_parser
    from vllm.entrypoints.openai.server_args import validate_server_args

    argv = ["serve", tiny_llama_dir, "--device", "cpu", "--disable-custom-all-reduce",
            "--tokenizer-revision", "main", "--preemption-mode", "recompute",
            "--compilation-config", '{"level": 3}', "--cpu-offload-gb", "0",
            "--disable-frontend-multiprocessing", "--enable-request-id-headers",
            "--disable-fastapi-docs", "--model", tiny_llama_dir + "-other",
            "--lora-extra-vocab-size", "512", "--disable-uvicorn-access-log",
            "--chat-template-content-format", "openai", "--convert", "none",
            "--max-parallel-loading-workers", "2", "--num-scheduler-steps", "8",
            "--multi-step-stream-outputs", "False"]  # fmt: skip
    args = make_parser().parse_args(argv)
    with caplog.at_level("WARNING"):
        engine_args = validate_server_args(args)
    assert args.enable_request_id_headers and args.disable_fastapi_docs
    assert args.chat_template_content_format == "openai"
    assert engine_args.lora_extra_vocab_size == 512 and engine_args.convert == "none"
    assert engine_args.multi_step_stream_outputs is False
    for spelled, value in (([], True), (["--multi-step-stream-outputs"], True),
                           (["--multi-step-stream-outputs", "true"], True),
                           (["--multi-step-stream-outputs=0"], False)):  # fmt: skip
        parsed = make_parser().parse_args(["serve", tiny_llama_dir, *spelled])
        assert parsed.multi_step_stream_outputs is value, spelled
    assert engine_args.create_engine_config().pooler_config is None  # generation
    text = caplog.text
    for name in (
        "disable_custom_all_reduce=True",
        "tokenizer_revision='main'",
        "compilation_config=",
        "Both MODEL",
        "lora_extra_vocab_size=512 is ignored",
        "max_parallel_loading_workers=2 is ignored",
    ):
        assert name in text, name
    import uvicorn

    from vllm.entrypoints.openai.api_server import uvicorn_options

    assert uvicorn.Config(app=None, **uvicorn_options(args)).access_log is False
    defaults = make_parser().parse_args(["serve"])
    assert uvicorn.Config(app=None, **uvicorn_options(defaults)).access_log is True
    assert defaults.chat_template_content_format == "auto"
    assert (defaults.lora_extra_vocab_size, defaults.convert) == (256, "auto")


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--long-lora-scaling-factors", "4.0", "8.0"],
         ["--long-lora-scaling-factors", "is not supported"]),
        (["--convert", "classify"], ["convert='classify' is not supported", "'embed'"]),
        (["--chat-template-content-format", "text"],
         ["argument --chat-template-content-format: invalid choice: 'text'"]),
        (["--enable-log-requests", "--disable-log-requests"],
         ["--enable-log-requests and --disable-log-requests contradict"]),
        (["--guided-decoding-backend", "outlines"],
         ["guided_decoding_backend must be one of ['auto', 'xgrammar'], got 'outlines'"]),
        (["--structured-outputs-config", '{"backend": "outlines"}'],
         ["guided_decoding_backend must be one of ['auto', 'xgrammar'], got 'outlines'"]),
        (["--structured-outputs-config", '{"reasoning_parser": "qwen3"}'],
         ["structured_outputs_config key 'reasoning_parser' is not supported"]),
        (["--structured-outputs-config", '{"disable_any_whitespace": "yes"}'],
         ["structured_outputs_config disable_any_whitespace='yes' is not supported"]),
    ],
)  # fmt: skip
def test_refused_upstream_serve_flags(tiny_llama_dir, flags, words):
    """One ``error:`` line naming the flag, exit status 2, before anything loads."""
    proc = run_cli("serve", tiny_llama_dir, "--device", "cpu", "--port", "0", *flags,
                   timeout=120)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), proc.stderr[-2000:]
    for w in words:
        assert w in last, last


def test_request_id_header_middleware():
    import asyncio

    from vllm.entrypoints.openai.request_guards import RequestIdHeader

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    def run(headers):
        sent = []

        async def send(msg):
            sent.append(msg)

        scope = {"type": "http", "headers": headers}
        asyncio.run(RequestIdHeader(app)(scope, None, send))
        return dict(sent[0]["headers"])[b"x-request-id"]

    assert run([(b"x-request-id", b"abc")]) == b"abc"
    fresh = run([])
    assert len(fresh) == 32 and fresh != run([])
    # the handler sees the fresh id (and derives the response and engine ids from it)
    from vllm.entrypoints.openai.request_guards import FRESH_REQUEST_ID

    seen, sent = [], []

    async def app2(scope, receive, send):
        seen.append(scope.get(FRESH_REQUEST_ID))
        await app(scope, receive, send)

    async def record(msg):
        sent.append(msg)

    for headers in ([], [(b"x-request-id", b"abc")]):
        asyncio.run(RequestIdHeader(app2)({"type": "http", "headers": headers}, None, record))
    assert seen[0] == dict(sent[0]["headers"])[b"x-request-id"].decode() and seen[1] is None


def test_api_server_module_runs_serve():
    """The V0 launch command reaches ``vllm serve``'s checks (one error line, exit 2)."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
           "/no/such/model.gguf", "--port", "0"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "/no/such/model.gguf" in proc.stderr


def test_api_server_module_help_matches_serve():
    """``python -m vllm.entrypoints.openai.api_server --help`` shows what ``vllm serve
    --help`` shows: the endpoints (embeddings included) and every flag's default."""
    outs = []
    for cmd in (["-m", "vllm.entrypoints.openai.api_server"], ["-m", "vllm.entrypoints.cli",
                                                                "serve"]):  # fmt: skip
        proc = subprocess.run([sys.executable, *cmd, "--help"], capture_output=True, text=True,
                              timeout=120)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs.append(" ".join(proc.stdout.split()))  # argparse wraps lines
    for text in outs:
        assert "with --task embed /v1/embeddings, /pooling, /score and /rerank" in text
        assert "/v1/responses, /v1/models, /tokenize, /detokenize" in text
        assert "--port PORT Port to bind (0: a free one). (default: 8000)" in text
        assert "--max-loras MAX_LORAS LoRA adapters one step may use (device slots). " \
            "(default: 1)" in text  # fmt: skip
    assert outs[0].split("positional arguments:")[1] == outs[1].split("positional arguments:")[1]


@pytest.mark.parametrize(
    "yaml_text, message",
    [
        ("model: /no/such/model-from-config.gguf\n", "/no/such/model-from-config.gguf"),
        ("max-model-len: 64\nbogus-key: 1\n", "'bogus-key' is not a flag of vllm serve"),
    ],
)
def test_api_server_module_reads_config_file(tmp_path, yaml_text, message):
    """``--config FILE`` of the V0 launch command is read as ``vllm serve`` reads it (the
    file's model is checked and its keys too), not skipped for the default model."""
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(yaml_text)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--config", str(cfg),
           "--port", "0"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last, last


def test_auto_guided_backend_and_enable_log_requests_flags(tiny_llama_dir):
    """``--guided-decoding-backend auto`` (upstream's default) runs xgrammar;
    ``--enable-log-requests`` (upstream's current flag) logs requests, as the default does.
    Guards: both refused as unknown values / flags."""
    from vllm.entrypoints.cli import make_parser
    from vllm.entrypoints.openai.server_args import validate_server_args
    from vllm.sampling_params import GuidedDecodingParams

    argv = ["serve", tiny_llama_dir, "--device", "cpu", "--guided-decoding-backend", "auto",
            "--enable-log-requests"]  # fmt: skip
    args = make_parser().parse_args(argv)
    config = validate_server_args(args).create_engine_config()
    assert config.decoding_config.guided_decoding_backend == "xgrammar"
    # upstream's current flag: the backend (and the defaults this engine implements)
    so = '{"backend": "auto", "disable_fallback": true, "enable_in_reasoning": false}'
    argv = ["serve", tiny_llama_dir, "--device", "cpu", "--structured-outputs-config", so]
    config = validate_server_args(make_parser().parse_args(argv)).create_engine_config()
    assert config.decoding_config.guided_decoding_backend == "xgrammar"
    assert args.enable_log_requests and not args.disable_log_requests
    defaults = make_parser().parse_args(["serve"])
    assert (defaults.enable_log_requests, defaults.disable_log_requests) == (False, False)
    assert GuidedDecodingParams(regex="a", backend="auto").backend == "xgrammar"
    spaced = GuidedDecodingParams(json={"type": "object"}, backend="auto:disable-any-whitespace")
    assert spaced.backend == "xgrammar:disable-any-whitespace" and spaced.disable_any_whitespace
    with pytest.raises(ValueError, match=r"one of \['auto', 'xgrammar'\].*got 'outlines'"):
        GuidedDecodingParams(regex="a", backend="outlines")


@pytest.mark.forked
def test_llm_auto_guided_backend_constrains_output(tiny_llama_dir):
    """``LLM(guided_decoding_backend="auto")`` and a request's ``backend="auto"`` run the
    xgrammar constraint: every sample is one of the choices."""
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import GuidedDecodingParams

    llm = LLM(tiny_llama_dir, device="cpu", max_model_len=64, guided_decoding_backend="auto")
    assert llm.llm_engine.config.decoding_config.guided_decoding_backend == "xgrammar"
    choices = ["apple pie", "banana split"]
    guided = GuidedDecodingParams(choice=choices, backend="auto")
    sp = SamplingParams(n=4, temperature=1.0, seed=0, max_tokens=16, guided_decoding=guided)
    out = llm.generate({"prompt_token_ids": [1, 300, 41]}, sp, use_tqdm=False)[0]
    assert [o.text in choices for o in out.outputs] == [True] * 4
