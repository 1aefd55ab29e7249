"""``vllm chat`` and ``vllm complete``: terminal clients of a running OpenAI-compatible server
(this one or any other), with upstream vLLM's flags.

    vllm chat [--url URL] [--model-name NAME] [--api-key KEY] [--system-prompt TEXT]
              [-q MESSAGE]
    vllm complete [--url URL] [--model-name NAME] [--api-key KEY] [--max-tokens N]
              [-q PROMPT]

Each line read from standard input is one message (chat, which keeps the conversation) or
one prompt (complete); the reply is streamed to standard output. ``-q/--quick`` sends one
and exits. The model defaults to the first one ``/v1/models`` lists; the key to
``$OPENAI_API_KEY``. ``--temperature`` (not in upstream's clients) sets the sampling
temperature; left out, the server's default applies.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator

import httpx

from vllm import envs


def add_client_args(parser: argparse.ArgumentParser, chat: bool) -> None:
    """The flags of ``vllm chat`` (``chat``) or ``vllm complete``."""
    parser.add_argument("--url", default="http://localhost:8000/v1", help="The server's /v1 URL.")
    parser.add_argument(
        "--model-name", default=None, help="Model to ask (default: the first of /v1/models)."
    )
    parser.add_argument(
        "--api-key", default=None, help="API key (default: the OPENAI_API_KEY variable)."
    )
    parser.add_argument("--temperature", type=float, default=None, help="Sampling temperature.")
    if chat:
        parser.add_argument("--system-prompt", default=None, help="A system message first.")
        quick = "Send MESSAGE, print the reply and exit."
    else:
        parser.add_argument("--max-tokens", type=int, default=None, help="Tokens per reply.")
        quick = "Send PROMPT, print the completion and exit."
    parser.add_argument("-q", "--quick", metavar="MESSAGE" if chat else "PROMPT", help=quick)


class _Client:
    def __init__(self, args: argparse.Namespace):
        key = args.api_key or envs.OPENAI_API_KEY
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(base_url=args.url.rstrip("/"), headers=headers, timeout=None)
        self.model = args.model_name or self._first_model()
        self.args = args

    def _first_model(self) -> str:
        r = self.http.get("/models")
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code} from {r.url}: {r.text[:500]}")
        models = r.json()["data"]
        if not models:
            raise RuntimeError(f"{self.http.base_url}/models lists no model.")
        return models[0]["id"]

    def stream(self, path: str, body: dict) -> Iterator[dict]:
        """POST ``body`` with stream true; yield each SSE data object."""
        body = {"model": self.model, "stream": True, **body}
        if self.args.temperature is not None:
            body["temperature"] = self.args.temperature
        with self.http.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                r.read()
                raise RuntimeError(f"HTTP {r.status_code}: {r.text[:500]}")
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    data = json.loads(line[6:])
                    if "error" in data:
                        raise RuntimeError(data["error"].get("message", str(data["error"])))
                    yield data


def _lines(quick: str | None) -> Iterator[str]:
    if quick is not None:
        yield quick
        return
    while True:
        try:
            line = input("> ")
        except EOFError:
            return
        if line.strip():
            yield line


def run_chat(args: argparse.Namespace) -> int:
    """The ``vllm chat`` loop; returns the exit status (1 on a server or HTTP error)."""
    try:
        client = _Client(args)
        messages = []
        if args.system_prompt:
            messages.append({"role": "system", "content": args.system_prompt})
        for line in _lines(args.quick):
            messages.append({"role": "user", "content": line})
            reply = ""
            for data in client.stream("/chat/completions", {"messages": messages}):
                for choice in data.get("choices", []):
                    piece = choice.get("delta", {}).get("content") or ""
                    reply += piece
                    print(piece, end="", flush=True)
            print()
            messages.append({"role": "assistant", "content": reply})
    except (httpx.HTTPError, RuntimeError) as e:
        return _fail(e, args.url)
    return 0


def _fail(e: Exception, url: str) -> int:
    """Print one ``error:`` line (naming the server URL when it could not be reached)."""
    if isinstance(e, httpx.TransportError):
        print(f"error: cannot reach the server at {url} ({e}); is `vllm serve` running "
              "there? (--url sets the address)", file=sys.stderr)  # fmt: skip
    else:
        print(f"error: {e}", file=sys.stderr)
    return 1


def run_complete(args: argparse.Namespace) -> int:
    """The ``vllm complete`` loop; returns the exit status (1 on a server or HTTP error)."""
    try:
        client = _Client(args)
        for line in _lines(args.quick):
            body = {"prompt": line}
            if args.max_tokens is not None:
                body["max_tokens"] = args.max_tokens
            for data in client.stream("/completions", body):
                for choice in data.get("choices", []):
                    print(choice.get("text", ""), end="", flush=True)
            print()
    except (httpx.HTTPError, RuntimeError) as e:
        return _fail(e, args.url)
    return 0
