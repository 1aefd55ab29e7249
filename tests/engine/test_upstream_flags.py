"""Upstream flags for features this engine lacks (vllm/engine/upstream_flags.py): accepted
at the values that change nothing, so the engine config equals the one built without
them; refused at any other value with one error naming the flag, the value and what is
supported, from `vllm serve`'s flags, a `--config` file and `LLM` / `EngineArgs` keywords
alike."""

import json
import logging
import os
import subprocess
import sys

import pytest

from vllm.engine.arg_utils import EngineArgs
from vllm.entrypoints import cli
from vllm.entrypoints.config_file import expand_config_file
from vllm.entrypoints.openai.server_args import validate_server_args

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# Every upstream flag of the group at a value it accepts (the default, or what this engine
# does anyway), in the spellings a launch command uses.
ACCEPTED = [
    "-dp", "1", "--data-parallel-size-local", "1", "--data-parallel-rank", "0",
    "--data-parallel-start-rank", "0", "--data-parallel-backend", "mp",
    "--no-data-parallel-hybrid-lb", "--data-parallel-external-lb", "false",
    "--no-enable-expert-parallel", "-ep", "false", "--no-enable-eplb", "--no-async-scheduling",
    "--no-enable-sleep-mode", "--worker-cls", "auto", "--worker-extension-cls", "",
    "--model-impl", "vllm", "--disable-cascade-attn", "--disable-hybrid-kv-cache-manager",
    "--no-enable-prompt-embeds", "--limit-mm-per-prompt", '{"image": 0, "video": {"count": 0}}',
    "--stream-interval", "1", "--api-server-count", "1", "--tokenizer-mode", "hf",
    "--disable-custom-all-reduce", "--disable-frontend-multiprocessing",
]  # fmt: skip


def _serve_parser():
    return cli.make_parser()._subparsers._group_actions[0].choices["serve"]


def _validate(*argv):
    """`vllm serve ARGV`'s flags (a --config file expanded) validated as the server does,
    before anything loads; returns the EngineArgs."""
    args = cli.make_parser().parse_args(expand_config_file(["serve", *argv], _serve_parser()))
    return validate_server_args(args)


def _config(tiny_llama_dir, *flags):
    return _validate(tiny_llama_dir, "--device", "cpu", *flags).create_engine_config()


def test_accepted_values_change_nothing(tiny_llama_dir):
    base = _config(tiny_llama_dir)
    ea = _validate(tiny_llama_dir, "--device", "cpu", *ACCEPTED)
    assert (ea.data_parallel_size, ea.data_parallel_size_local, ea.data_parallel_rank) == (1, 1, 0)
    assert ea.async_scheduling is False and ea.enable_expert_parallel is False
    assert ea.disable_cascade_attn is True and ea.disable_hybrid_kv_cache_manager is True
    assert (ea.model_impl, ea.worker_cls, ea.worker_extension_cls) == ("vllm", "auto", "")
    assert json.loads(ea.limit_mm_per_prompt) == {"image": 0, "video": {"count": 0}}
    config = ea.create_engine_config()
    assert config == base  # every sub-config, field by field
    assert config.model_config.tokenizer_mode == "auto"  # hf: the Hugging Face tokenizer
    # the defaults themselves (nothing typed) are accepted values too
    d = EngineArgs()
    assert (d.data_parallel_size, d.async_scheduling, d.worker_cls, d.model_impl) == (
        1, None, "auto", "auto",
    )  # fmt: skip


REFUSED = [
    (["--data-parallel-size", "2"], "data_parallel_size=2 (--data-parallel-size 2)", "1"),
    (["-dp", "4"], "data_parallel_size=4 (--data-parallel-size 4)", "1"),
    (["-dpl", "2"], "data_parallel_size_local=2 (--data-parallel-size-local 2)", "1 (or unset)"),
    (["--data-parallel-rank", "1"], "data_parallel_rank=1 (--data-parallel-rank 1)", "0 (or"),
    (["-dpr", "2"], "data_parallel_start_rank=2 (--data-parallel-start-rank 2)", "0 (or"),
    (["-dpa", "10.0.0.1"], "data_parallel_address='10.0.0.1' (--data-parallel-address 10.0.0.1)",
     "unset"),
    (["-dpp", "13345"], "data_parallel_rpc_port=13345 (--data-parallel-rpc-port 13345)", "unset"),
    (["-dpb", "ray"], "data_parallel_backend='ray' (--data-parallel-backend ray)", "'mp'"),
    (["-dph"], "data_parallel_hybrid_lb=True (--data-parallel-hybrid-lb)", "off"),
    (["--data-parallel-external-lb"], "data_parallel_external_lb=True", "off"),
    (["--enable-expert-parallel"], "enable_expert_parallel=True (--enable-expert-parallel)",
     "off"),
    (["-ep"], "enable_expert_parallel=True (--enable-expert-parallel)", "off"),
    (["--enable-eplb"], "enable_eplb=True (--enable-eplb)", "off"),
    (["--async-scheduling"], "async_scheduling=True (--async-scheduling)",
     "off (--no-async-scheduling, or unset)"),
    (["--enable-sleep-mode"], "enable_sleep_mode=True (--enable-sleep-mode)", "off"),
    (["--worker-cls", "my.Worker"], "worker_cls='my.Worker' (--worker-cls my.Worker)", "'auto'"),
    (["--worker-extension-cls", "rlhf.Ext"],
     "worker_extension_cls='rlhf.Ext' (--worker-extension-cls rlhf.Ext)", "'' (none)"),
    (["--model-impl", "transformers"], "model_impl='transformers' (--model-impl transformers)",
     "'auto' or 'vllm'"),
    (["--no-disable-hybrid-kv-cache-manager"],
     "disable_hybrid_kv_cache_manager=False (--no-disable-hybrid-kv-cache-manager)",
     "on (or unset)"),
    (["--kv-transfer-config", '{"kv_connector": "LMCacheConnectorV1"}'],
     "kv_transfer_config='{\"kv_connector\": \"LMCacheConnectorV1\"}'", "unset"),
    (["--kv-events-config", "{}"], "kv_events_config='{}' (--kv-events-config {})", "unset"),
    (["--otlp-traces-endpoint", "http://otel:4317"],
     "otlp_traces_endpoint='http://otel:4317' (--otlp-traces-endpoint http://otel:4317)",
     "unset"),
    (["--enable-prompt-embeds"], "enable_prompt_embeds=True (--enable-prompt-embeds)", "off"),
    (["--limit-mm-per-prompt", '{"image": 1}'], "limit_mm_per_prompt='{\"image\": 1}'",
     "a count of 0 for every modality"),
    (["--stream-interval", "8"], "stream_interval=8 (--stream-interval 8)", "1"),
    (["--tokenizer-mode", "mistral"], "tokenizer_mode='mistral' (--tokenizer-mode mistral)",
     "['auto', 'hf', 'slow']"),
    (["-asc", "4"], "api_server_count=4 (--api-server-count 4)", "1 (or unset)"),
    (["--headless"], "headless=True (--headless)", "off"),
    (["--uds", "/tmp/v.sock"], "uds='/tmp/v.sock' (--uds /tmp/v.sock)", "unset"),
]  # fmt: skip


@pytest.mark.parametrize("flags,names,supported", REFUSED)
def test_refused_values_name_flag_value_and_supported(tiny_llama_dir, flags, names, supported):
    with pytest.raises(ValueError) as exc:
        _validate(tiny_llama_dir, "--device", "cpu", *flags)
    message = str(exc.value)
    assert message.startswith(names), message
    assert "is not supported" in message and supported in message, message
    assert "\n" not in message


def test_engine_keywords(tiny_llama_dir):
    """EngineArgs (LLM's keyword arguments) take the same fields: upstream's defaults and
    no-op values build the same config, other values raise the same errors."""
    base = EngineArgs(model=tiny_llama_dir, device="cpu").create_engine_config()
    same = EngineArgs(
        model=tiny_llama_dir, device="cpu", data_parallel_size=1, enable_expert_parallel=False,
        async_scheduling=False, enable_sleep_mode=False, worker_cls="auto", model_impl="auto",
        disable_cascade_attn=True, disable_hybrid_kv_cache_manager=True,
        limit_mm_per_prompt={"image": 0}, kv_transfer_config=None, tokenizer_mode="hf",
    ).create_engine_config()  # fmt: skip
    assert same == base
    for kwargs, match in [
        (dict(data_parallel_size=2), r"^data_parallel_size=2 \(--data-parallel-size 2\) is "
         r"not supported: data parallelism is not implemented.*; supported: 1\.$"),
        (dict(enable_sleep_mode=True), r"^enable_sleep_mode=True \(--enable-sleep-mode\)"),
        (dict(async_scheduling=True), r"^async_scheduling=True \(--async-scheduling\)"),
        (dict(enable_expert_parallel=True), r"^enable_expert_parallel=True"),
        (dict(limit_mm_per_prompt={"image": 2}),
         r"^limit_mm_per_prompt=\{'image': 2\} \(--limit-mm-per-prompt '\{\"image\": 2\}'\)"),
        (dict(kv_transfer_config={"kv_connector": "X"}), r"^kv_transfer_config=\{'kv_connec"),
        (dict(data_parallel_size="2"), r"data_parallel_size must be an int, got '2'"),
    ]:  # fmt: skip
        with pytest.raises(ValueError, match=match):
            EngineArgs(model=tiny_llama_dir, device="cpu", **kwargs).create_engine_config()


def test_llm_refuses_before_loading(tiny_llama_dir):
    from vllm import LLM

    with pytest.raises(ValueError, match=r"^data_parallel_size=2 \(--data-parallel-size 2\)"):
        LLM(tiny_llama_dir, device="cpu", data_parallel_size=2)


@pytest.mark.forked
def test_llm_with_upstream_defaults_generates_the_same(tiny_llama_dir):
    from vllm import LLM, SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    prompts = [{"prompt_token_ids": [1, 5, 9, 22]}, {"prompt_token_ids": [1, 300, 41]}]
    llm = LLM(
        tiny_llama_dir, device="cpu", max_model_len=128, data_parallel_size=1,
        async_scheduling=False, enable_expert_parallel=False, enable_sleep_mode=False,
        disable_custom_all_reduce=True, worker_cls="auto",
    )  # fmt: skip
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]
    llm.llm_engine.shutdown()
    llm = LLM(tiny_llama_dir, device="cpu", max_model_len=128)
    want = [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]
    llm.llm_engine.shutdown()
    assert got == want and len(got[0]) == 6


def test_config_file_keys(tmp_path, tiny_llama_dir):
    """A --config YAML of upstream's keys: accepted values give the config built without
    them, a refused one the same error as the flag."""
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(
        f"model: {tiny_llama_dir}\ndevice: cpu\ndata-parallel-size: 1\n"
        "enable-expert-parallel: false\nasync-scheduling: false\nenable-sleep-mode: false\n"
        "disable-custom-all-reduce: true\ndisable_cascade_attn: true\nworker-cls: auto\n"
        "limit-mm-per-prompt: {image: 0}\napi-server-count: 1\ntokenizer-mode: hf\n"
    )
    ea = _validate("--config", str(cfg))
    assert ea.async_scheduling is False and json.loads(ea.limit_mm_per_prompt) == {"image": 0}
    assert ea.create_engine_config() == _config(tiny_llama_dir)
    for line, message in [
        ("data-parallel-size: 2", "data_parallel_size=2 (--data-parallel-size 2)"),
        ("enable-sleep-mode: true", "enable_sleep_mode=True (--enable-sleep-mode)"),
        ("async-scheduling: true", "async_scheduling=True (--async-scheduling)"),
        ("kv-transfer-config: {kv_connector: LMCacheConnectorV1}",
         "kv_transfer_config='{\"kv_connector\": \"LMCacheConnectorV1\"}'"),
        ("api-server-count: 2", "api_server_count=2 (--api-server-count 2)"),
    ]:  # fmt: skip
        cfg.write_text(f"model: {tiny_llama_dir}\ndevice: cpu\n{line}\n")
        with pytest.raises(ValueError) as exc:
            _validate("--config", str(cfg))
        assert str(exc.value).startswith(message), str(exc.value)


def test_refusal_is_one_line_and_exit_2(tiny_llama_dir):
    proc = subprocess.run(
        [sys.executable, "-m", "vllm.entrypoints.cli", "serve", tiny_llama_dir, "--device",
         "cpu", "--enable-sleep-mode"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": REPO},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: enable_sleep_mode=True (--enable-sleep-mode) is not supported: sleep mode "
        "(LLM.sleep / wake_up, freeing the weights and KV cache) is not implemented; "
        "supported: off."
    ]


def test_upstream_spellings_of_existing_flags(tiny_llama_dir):
    """Upstream's current names of flags this engine has: -cc and --optimization-level
    (like -O, upstream's torch.compile settings, logged as ignored), and
    --cudagraph-capture-sizes (this engine's --cuda-graph-sizes)."""
    ea = _validate(tiny_llama_dir, "--device", "cpu", "--cudagraph-capture-sizes", "1", "2", "4")
    assert ea.cuda_graph_sizes == [1, 2, 4]
    assert ea.create_engine_config().compilation_config.cuda_graph_sizes == [1, 2, 4]
    assert _validate(tiny_llama_dir, "--device", "cpu", "-cc", '{"level": 3}').compilation_config
    ea = _validate(tiny_llama_dir, "--device", "cpu", "--optimization-level", "3")
    assert ea.compilation_config == "3"


def test_code_revision_is_logged_as_ignored(tiny_llama_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="vllm.engine.upstream_flags"):
        _validate(tiny_llama_dir, "--device", "cpu", "--code-revision", "v2")
    assert "code_revision='v2' is ignored: the model is read from the local path" in caplog.text


def test_help_lists_the_group(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "--help=upstream"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and out.startswith("upstream options:")
    for flag in ("--data-parallel-size DATA_PARALLEL_SIZE, -dp", "--enable-expert-parallel",
                 "--async-scheduling, --no-async-scheduling", "--enable-sleep-mode",
                 "--worker-cls", "--api-server-count", "--headless"):  # fmt: skip
        assert flag in out, flag
    assert "--max-num-seqs MAX_NUM_SEQS" not in out and "--port PORT" not in out


def test_ssl_cert_reqs_reaches_uvicorn(tmp_path, tiny_llama_dir):
    """--ssl-cert-reqs (upstream's; 2: client certificates required) goes to uvicorn with
    TLS and CA certificates; without them it is refused, and 0 (the default) adds nothing."""
    import ssl

    import uvicorn

    from vllm.entrypoints.openai.api_server import uvicorn_options

    for name in ("k.pem", "c.pem", "ca.pem"):
        (tmp_path / name).write_text("")
    tls = ["--ssl-keyfile", str(tmp_path / "k.pem"), "--ssl-certfile", str(tmp_path / "c.pem"),
           "--ssl-ca-certs", str(tmp_path / "ca.pem")]  # fmt: skip
    args = cli.make_parser().parse_args(["serve", *tls, "--ssl-cert-reqs", "2"])
    assert uvicorn_options(args)["ssl_cert_reqs"] == 2
    config = uvicorn.Config(app=None, **uvicorn_options(args))
    assert config.ssl_cert_reqs == ssl.CERT_REQUIRED
    assert "ssl_cert_reqs" not in uvicorn_options(cli.make_parser().parse_args(["serve", *tls]))
    with pytest.raises(ValueError, match=r"--ssl-cert-reqs 1 checks client certificates"):
        _validate(tiny_llama_dir, "--device", "cpu", "--ssl-cert-reqs", "1")
