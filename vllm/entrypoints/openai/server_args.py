"""``vllm serve``'s flags checked before anything is loaded (:func:`validate_server_args`),
and what they name: ``--middleware`` objects, the served model names."""

from __future__ import annotations

import argparse
import importlib
import inspect
import logging
import os

from vllm import envs
from vllm.engine.arg_utils import EngineArgs
from vllm.engine.default_model import resolve_model, served_model_names
from vllm.engine.upstream_flags import SERVER_FLAGS, check_upstream_flags
from vllm.entrypoints.chat_utils import check_default_template_kwargs, load_chat_template
from vllm.entrypoints.openai.lora_modules import lora_requests
from vllm.entrypoints.openai.tool_parsers import (
    get_tool_parser,
    load_tool_parser_plugin,
    tool_parser_names,
)
from vllm.reasoning import get_reasoning_parser

logger = logging.getLogger("vllm.entrypoints.openai.api_server")


def load_middleware(path: str):
    """The object ``--middleware PATH`` names (``package.module.Name``): an ASGI middleware
    class, or an async function ``(request, call_next)``, as upstream's flag.

    Raises:
        ValueError: the path cannot be imported, or names something else.
    """
    module_path, _, name = path.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module_path), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"--middleware {path!r} cannot be imported: {e}") from None
    if not (inspect.isclass(obj) or inspect.iscoroutinefunction(obj)):
        raise ValueError(
            f"--middleware {path!r} is a {type(obj).__name__}: it must be an ASGI middleware "
            "class or an async function (request, call_next)."
        )
    return obj


def served_names(args: argparse.Namespace) -> list[str]:
    """``--served-model-name``, else the model string given and its short name."""
    return args.served_model_name or served_model_names(args.model, not args.model_is_default)


def validate_server_args(args: argparse.Namespace) -> EngineArgs:
    """Check every flag before anything is loaded: resolve the model (the default when
    none is given), load ``--chat-template``, build and validate the engine config.

    Sets ``args.model`` (the path), ``args.model_is_default``, ``args.chat_template``
    (the template text), ``args.tool_parser`` (the parser of tool_choice "auto", or
    None; after ``--tool-parser-plugin`` is imported), ``args.reasoning`` (the
    ``--reasoning-parser``, or None), ``args.middleware_objects`` (what each
    ``--middleware`` names) and ``args.log_error_stack`` (its default resolved).

    Raises:
        ValueError: naming the bad value (the caller prints it on one line, exit 2).
    """
    args.model_is_default = not (args.model or args.model_flag)
    if args.model and args.model_flag and args.model != args.model_flag:
        logger.warning(
            "Both MODEL (%s) and --model (%s) were given; serving MODEL.", args.model,
            args.model_flag,
        )  # fmt: skip
    args.model = resolve_model(args.model or args.model_flag, log=False)
    check_upstream_flags(args, SERVER_FLAGS)
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}.")
    if args.max_log_len is not None and args.max_log_len < 0:
        raise ValueError(f"--max-log-len must be >= 0, got {args.max_log_len}.")
    if args.max_request_body_bytes < 0:  # every body, even an empty one, would get 413
        raise ValueError(
            f"--max-request-body-bytes must be >= 0 (0: no limit), got "
            f"{args.max_request_body_bytes}."
        )
    if not args.shutdown_timeout >= 0:  # (NaN too)
        raise ValueError(f"--shutdown-timeout must be >= 0 seconds, got {args.shutdown_timeout}.")
    if bool(args.ssl_keyfile) != bool(args.ssl_certfile):
        raise ValueError("--ssl-keyfile and --ssl-certfile must be given together.")
    for flag in ("ssl_keyfile", "ssl_certfile", "ssl_ca_certs"):
        path = getattr(args, flag)
        if path is not None and not os.path.isfile(path):
            raise ValueError(f"--{flag.replace('_', '-')} {path!r} is not a file.")
    if args.ssl_cert_reqs and not (args.ssl_keyfile and args.ssl_ca_certs):
        raise ValueError(
            f"--ssl-cert-reqs {args.ssl_cert_reqs} checks client certificates: it needs TLS "
            "(--ssl-keyfile, --ssl-certfile) and --ssl-ca-certs."
        )
    if args.root_path and not args.root_path.startswith("/"):
        raise ValueError(f"--root-path must start with '/', got {args.root_path!r}.")
    if args.enable_log_requests and args.disable_log_requests:
        raise ValueError("--enable-log-requests and --disable-log-requests contradict: give one.")
    if args.enable_log_outputs and args.disable_log_requests:
        raise ValueError(
            "--enable-log-outputs logs outputs in the request log, which "
            "--disable-log-requests turns off: give one."
        )
    if args.log_error_stack is None:
        args.log_error_stack = envs.VLLM_SERVER_DEV_MODE
    if not args.response_role:
        raise ValueError("--response-role must not be empty.")
    check_default_template_kwargs(args.default_chat_template_kwargs)
    args.chat_template = load_chat_template(args.chat_template)
    if args.tool_parser_plugin is not None:
        load_tool_parser_plugin(args.tool_parser_plugin)
    args.tool_parser = None
    if args.tool_call_parser is not None:
        args.tool_parser = get_tool_parser(args.tool_call_parser)
    if args.enable_auto_tool_choice and args.tool_parser is None:
        raise ValueError(
            "--enable-auto-tool-choice needs --tool-call-parser (one of "
            f"{', '.join(tool_parser_names())})."
        )
    if not args.enable_auto_tool_choice:
        args.tool_parser = None
    args.reasoning = None
    if args.reasoning_parser is not None:
        args.reasoning = get_reasoning_parser(args.reasoning_parser)
    args.middleware_objects = [load_middleware(path) for path in args.middleware]
    engine_args = EngineArgs.from_cli_args(args)
    engine_args.create_engine_config()
    args.lora_requests = lora_requests(args.lora_modules, served_names(args), args.enable_lora)
    return engine_args
