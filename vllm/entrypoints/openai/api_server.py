"""``vllm serve`` (and ``python -m vllm.entrypoints.openai.api_server``): check the flags
(server_args.py), bind the port, build the engine, serve the app (server_app.py) with
uvicorn.

Shutdown: SIGINT/SIGTERM start a graceful exit: the server stops accepting and the requests
in flight may finish for ``--shutdown-timeout`` seconds; those still running then are
aborted (streams get a final chunk with finish_reason "abort" and ``[DONE]``, other
requests a 503 naming the shutdown), then the app's lifespan stops the engine
(``AsyncLLMEngine.shutdown`` -> ``LLMEngine.shutdown``) and the process exits with 0. A
second signal aborts the requests at once; a third exits without waiting
(server_lifecycle.py).

Engine death: when the engine loop dies (e.g. a pipeline worker process was killed),
/health answers 503, the requests in flight fail, and the server exits with status 1 so
that a supervisor restarts it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sys
import traceback

from vllm import envs
from vllm.engine.arg_utils import EngineArgs
from vllm.engine.async_llm_engine import AsyncLLMEngine
from vllm.engine.metrics import EngineMetrics
from vllm.entrypoints.openai.server_app import CorsOptions, build_app
from vllm.entrypoints.openai.server_args import served_names, validate_server_args
from vllm.entrypoints.openai.server_lifecycle import ABORT_GRACE_S, graceful_server_class
from vllm.logger import configure_command_logging
from vllm.version import __version__

logger = logging.getLogger("vllm.entrypoints.openai.api_server")


def server_url(scheme: str, host: str, port: int) -> str:
    """``scheme://host:port``, an IPv6 host in brackets (RFC 3986: ``http://[::1]:8000``)."""
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind ``host:port`` before the engine is built, so a busy port fails at once.

    Raises:
        ValueError: the address cannot be bound (in use, not an address of this host).
    """
    try:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as e:
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror or e}.") from e
    return sock


def uvicorn_options(args: argparse.Namespace) -> dict:
    """uvicorn.Config keywords from the server flags: TLS from ``--ssl-keyfile`` /
    ``--ssl-certfile`` / ``--ssl-ca-certs`` / ``--ssl-cert-reqs`` (uvicorn's names; the
    last only when it asks for client certificates), ``access_log`` off with
    ``--disable-uvicorn-access-log``. ``--root-path`` is the app's (see :func:`build_app`),
    not uvicorn's, which would prefix every request path."""
    out: dict = {"access_log": not args.disable_uvicorn_access_log}
    for flag in ("ssl_keyfile", "ssl_certfile", "ssl_ca_certs"):
        if getattr(args, flag) is not None:
            out[flag] = getattr(args, flag)
    if args.ssl_cert_reqs:
        out["ssl_cert_reqs"] = args.ssl_cert_reqs
    return out


def event_loop_factory():
    """uvloop's event loop when it is installed (a requirement on Linux), else None (the
    asyncio default). Why: the server streams one small write per token per request and
    shares the GIL with the engine thread; uvloop runs the loop and its socket writes in C,
    so each streamed chunk costs less Python time (upstream's API server runs on uvloop
    too)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def build_engine(args: argparse.Namespace, engine_args: EngineArgs) -> AsyncLLMEngine:
    """The server's engine (model loaded, KV cache sized, graphs captured).

    Raises:
        ValueError: a setting the engine refuses only once the model is loaded (a KV cache
            that cannot hold one max_model_len sequence); ``vllm serve`` reports it as
            the other bad settings (one ``error:`` line, exit status 2).
    """
    if args.model_is_default:
        logger.info("No MODEL given: serving the default SmolLM2-135M-Instruct GGUF %s", args.model)
    engine = AsyncLLMEngine(
        engine_args,
        metrics=EngineMetrics(served_names(args)[0], log_stats=not args.disable_log_stats),
        log_requests=not args.disable_log_requests,
        max_log_len=args.max_log_len,
        log_outputs=args.enable_log_outputs,
    )
    try:
        for lora in args.lora_requests:  # each adapter read once, before serving
            engine.engine.adapters.check(lora)
    except ValueError:
        engine.engine.shutdown()  # the loop never started: stop the workers only
        raise
    return engine


def run_server(args: argparse.Namespace, engine: AsyncLLMEngine, sock: socket.socket) -> int:
    """Serve ``engine`` on ``sock`` until SIGINT/SIGTERM (returns 0) or until the engine
    dies (returns 1). ``args`` come from :func:`validate_server_args`, ``engine`` from
    :func:`build_engine`, ``sock`` from :func:`bind_socket`."""
    import uvicorn

    _GracefulServer = graceful_server_class()
    names = served_names(args)
    limit = args.max_request_body_bytes or None
    api_key = args.api_key or envs.VLLM_API_KEY
    cors = CorsOptions(
        tuple(args.allowed_origins),
        tuple(args.allowed_methods),
        tuple(args.allowed_headers),
        args.allow_credentials,
    )
    app = build_app(
        engine,
        names,
        api_key,
        limit,
        args.chat_template,
        args.tool_parser,
        cors=cors,
        root_path=args.root_path,
        response_role=args.response_role,
        return_tokens_as_token_ids=args.return_tokens_as_token_ids,
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        lora_modules=args.lora_requests,
        enable_request_id_headers=args.enable_request_id_headers,
        disable_fastapi_docs=args.disable_fastapi_docs,
        chat_template_content_format=args.chat_template_content_format,
        reasoning_parser=args.reasoning,
        enable_force_include_usage=args.enable_force_include_usage,
        enable_server_load_tracking=args.enable_server_load_tracking,
        middleware=args.middleware_objects,
        exclude_tools_when_tool_choice_none=args.exclude_tools_when_tool_choice_none,
        default_chat_template_kwargs=args.default_chat_template_kwargs,
        log_error_stack=args.log_error_stack,
        trust_request_chat_template=args.trust_request_chat_template,
    )
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_level=args.uvicorn_log_level,
        timeout_graceful_shutdown=args.shutdown_timeout + ABORT_GRACE_S,
        timeout_keep_alive=5,
        **uvicorn_options(args),
    )
    server = _GracefulServer(config, engine, args.shutdown_timeout)
    engine.on_dead = server.engine_died
    scheme = "https" if args.ssl_certfile else "http"
    logger.info(
        "vLLM API server version %s listening on %s",
        __version__,
        server_url(scheme, args.host, port),
    )
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(server.serve(sockets=[sock]))
    logger.info("Server stopped (exit status %d).", server.exit_code)
    return server.exit_code


def serve(args: argparse.Namespace) -> int:
    """``vllm serve`` from parsed flags: check them, bind, build the engine, serve.
    Returns the exit status (2: a bad flag or a setting the engine refuses, printed as one
    ``error:`` line; ``--debug`` adds the traceback)."""
    configure_command_logging(args.debug)
    try:
        engine_args = validate_server_args(args)
        sock = bind_socket(args.host, args.port)
        engine = build_engine(args, engine_args)  # loads the model: KV capacity checked
    except ValueError as e:
        if args.debug:
            traceback.print_exc()
        sys.stderr.write(f"error: {e}\n")
        return 2
    return run_server(args, engine, sock)


def main(argv: list[str] | None = None) -> int:
    """``python -m vllm.entrypoints.openai.api_server [MODEL] [flags]``: upstream V0's
    launch command, the same as ``vllm serve`` (``--config`` included; ``--help`` shows
    the same description and every flag's default)."""
    from vllm.entrypoints.config_file import expand_config_file
    from vllm.entrypoints.openai.cli_args import SERVE_DESCRIPTION, make_server_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser, HelpFormatter

    parser = FlexibleArgumentParser(
        prog="python -m vllm.entrypoints.openai.api_server",
        description=SERVE_DESCRIPTION,
        formatter_class=HelpFormatter,
    )
    make_server_parser(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    try:  # expand_config_file reads the arguments of a ``serve`` command line
        argv = expand_config_file(["serve", *argv], parser)[1:]
    except ValueError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    return serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
