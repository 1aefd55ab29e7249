"""``vllm run-batch``: OpenAI batch files run offline, as upstream's.

    vllm run-batch -i requests.jsonl -o results.jsonl [--model MODEL] [engine flags]

Each input line is one request of the OpenAI batch format::

    {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": {...}}

with ``url`` one of :data:`URLS` (completions and chat; on an embedding engine,
``--task embed``, embeddings and every score and rerank spelling, as upstream's
run-batch). Every request goes through the same FastAPI app as ``vllm serve`` (in process,
over httpx's ASGI transport, no socket), so a body is validated and answered exactly as the
server would (a generate engine refuses an embeddings line with the server's 400); all
requests run concurrently and share the engine's batches. Each output line, in input order::

    {"id": "vllm-<hex>", "custom_id": "r1",
     "response": {"status_code": 200, "request_id": "vllm-batch-<hex>", "body": {...}},
     "error": null}

A request the server refuses keeps its status code and error body in ``response``; a line
that is not a request at all (bad JSON, another method or url, ``stream`` true) gets
``response`` null and ``error`` saying why. The exit status is 0 once the output is written,
whatever the requests' outcomes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import uuid

import httpx
from tqdm.auto import tqdm

logger = logging.getLogger(__name__)

URLS = (
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/embeddings",
    # every spelling the server routes ends in /score or /rerank, as upstream's validator
    "/score",
    "/v1/score",
    "/rerank",
    "/v1/rerank",
    "/v2/rerank",
)


def add_run_batch_args(parser: argparse.ArgumentParser) -> None:
    """``vllm run-batch``'s flags: input / output files, the model and every engine flag."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.openai.cli_args import add_content_format_arg

    parser.add_argument("-i", "--input-file", required=True, help="The batch file (JSON lines).")
    parser.add_argument("-o", "--output-file", required=True, help="Where results are written.")
    parser.add_argument(
        "--model", default=None, help="HF directory or .gguf file (default: SmolLM2 GGUF)."
    )
    parser.add_argument(
        "--served-model-name", nargs="+", default=None, help="Names requests may use."
    )
    parser.add_argument("--chat-template", default=None, help="Template file or text.")
    parser.add_argument("--response-role", default="assistant", help="Role of chat replies.")
    parser.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="YAML file of flags (long names without '--'); flags typed here win.",
    )
    add_content_format_arg(parser)
    EngineArgs.add_cli_args(parser)


def parse_line(raw: str) -> tuple[dict | None, str | None]:
    """(the parsed line or None, why it is not a request or None)."""
    try:
        req = json.loads(raw)
    except json.JSONDecodeError as e:
        return None, f"invalid JSON: {e}"
    if not isinstance(req, dict):
        return None, "a line must be a JSON object"
    if req.get("method", "POST") != "POST":
        return req, f"method must be POST, got {req.get('method')!r}"
    if req.get("url") not in URLS:
        return req, f"url must be one of {list(URLS)}, got {req.get('url')!r}"
    if not isinstance(req.get("body"), dict):
        return req, "body must be a JSON object"
    if req["body"].get("stream"):
        return req, "stream is not supported in a batch"
    return req, None


async def _run(args: argparse.Namespace, engine_args) -> list[dict]:
    from vllm.engine.async_llm_engine import AsyncLLMEngine
    from vllm.engine.default_model import served_model_names
    from vllm.entrypoints.chat_utils import load_chat_template
    from vllm.entrypoints.openai.server_app import build_app

    with open(args.input_file) as f:
        lines = [line for line in f if line.strip()]
    engine = AsyncLLMEngine(engine_args, log_requests=False)
    names = args.served_model_name or served_model_names(args.model, not args.model_is_default)
    app = build_app(
        engine, names, None, None, load_chat_template(args.chat_template),
        response_role=args.response_role,
        chat_template_content_format=args.chat_template_content_format,
    )  # fmt: skip
    bar = tqdm(total=len(lines), desc="Batch requests")

    async def one(client: httpx.AsyncClient, raw: str) -> dict:
        req, why = parse_line(raw)
        out = {"id": f"vllm-{uuid.uuid4().hex}", "custom_id": None, "response": None}
        if req is not None:
            out["custom_id"] = req.get("custom_id")
        if why is not None:
            out["error"] = why
        else:
            r = await client.post(req["url"], json=req["body"])
            body = r.json() if r.content else None
            out["response"] = {
                "status_code": r.status_code,
                "request_id": f"vllm-batch-{uuid.uuid4().hex}",
                "body": body,
            }
            out["error"] = None
        bar.update(1)
        return out

    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://batch", timeout=None
        ) as c:
            return await asyncio.gather(*(one(c, raw) for raw in lines))
    finally:
        bar.close()
        await engine.shutdown()


def check_writable(path: str) -> None:
    """Raises OSError naming ``path`` when the output file could not be written: its
    directory is missing, the path is a directory, or opening it for writing fails (a
    read-only file or directory, a /proc or /sys file; tried for real, since root passes
    permission checks). An existing file is left as it is; a new one is removed again."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise OSError(f"the output file {path!r} is a directory.")
    if not os.path.isdir(folder):
        raise OSError(f"the output file's directory {folder!r} does not exist.")
    existed = os.path.exists(path)
    try:
        open(path, "a").close()  # append: an existing file keeps its content
    except OSError as e:
        raise OSError(f"the output file {path!r} is not writable: {e.strerror}.") from None
    if not existed:
        os.remove(path)


def run_batch(args: argparse.Namespace) -> int:
    """Run ``args.input_file`` and write ``args.output_file``; returns 0, or 2 for a bad
    flag, an unreadable input file or an output file that cannot be written (printed on
    one line, before the model loads)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.engine.default_model import resolve_model

    try:
        args.model_is_default = not args.model
        args.model = resolve_model(args.model, log=False)
        engine_args = EngineArgs.from_cli_args(args)
        engine_args.create_engine_config()  # every flag checked before anything loads
        open(args.input_file).close()
        check_writable(args.output_file)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    results = asyncio.run(_run(args, engine_args))
    with open(args.output_file, "w") as f:
        for out in results:
            f.write(json.dumps(out) + "\n")
    ok = sum(1 for o in results if o["response"] and o["response"]["status_code"] == 200)
    logger.info("Wrote %d results (%d answered 200) to %s", len(results), ok, args.output_file)
    return 0
