"""``POST /v1/responses``: OpenAI's Responses API, served through the chat handler.

The request becomes a chat request (responses_input.py), the chat handler checks, renders
and runs it (reasoning parser, tool parser and structured outputs included), and its reply
becomes a ``response`` object: ``output`` holds a ``reasoning`` item (with
``--reasoning-parser``), a ``message`` item with one ``output_text`` part, and one
``function_call`` item per tool call, in that order; ``status`` is ``incomplete`` with
``incomplete_details.reason`` ``max_output_tokens`` when the budget ran out (and so is the
item it cut, the last); ``usage`` counts ``input_tokens`` / ``output_tokens``. The
response id ``resp_<id>`` is also the engine's request id. With ``include:
["message.output_text.logprobs"]`` or ``top_logprobs: N`` the output text carries its
per-token logprobs with N alternatives each (``output_text.logprobs``, and each
``response.output_text.delta`` event's own).

Streamed (``stream: true``), the chat stream's chunks become OpenAI's typed events, each
``event: TYPE`` / ``data: {..., "sequence_number": k}``: ``response.created``,
``response.in_progress``; for each output item ``response.output_item.added``, its deltas
(``response.reasoning_text.delta``; ``response.content_part.added`` then
``response.output_text.delta``; ``response.function_call_arguments.delta``), their
``.done`` events and ``response.output_item.done``; then ``response.completed`` (or
``response.incomplete``) with the whole response. An error after the stream began is an
``error`` event. Nothing is stored: ``GET /v1/responses/{id}`` is not served.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request

from vllm.entrypoints.openai.api_errors import APIError
from vllm.entrypoints.openai.responses_input import ResponsesRequest, to_chat_request
from vllm.entrypoints.openai.serving_chat import OpenAIServingChat

# chat's names of the request fields -> the Responses API's
_CHAT_TO_RESPONSES = {"messages": "input", "max_tokens": "max_output_tokens",
                      "response_format": "text"}  # fmt: skip
# The chat handler's words for what a Responses request calls otherwise, in its messages
# (an indexed ``messages[i]`` stays: it names the rendered conversation, which starts
# with the instructions when there are some).
_CHAT_WORDS = (
    (re.compile(r"\bmessages\b(?!\[)"), "input"),
    (re.compile(r"\bmax_tokens\b"), "max_output_tokens"),
    (re.compile(r"\bresponse_format\b"), "text.format"),
    (re.compile(r"\bChat Completions API\b"), "Responses API"),
)


def as_responses_error(param: str | None, message: str) -> tuple[str | None, str]:
    """A chat handler's error (``param``, ``message``) in the Responses API's names."""
    for pattern, word in _CHAT_WORDS:
        message = pattern.sub(word, message)
    return _CHAT_TO_RESPONSES.get(param, param), message


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _usage(usage: dict | None) -> dict | None:
    if usage is None:
        return None
    details = usage.get("prompt_tokens_details") or {}
    out = usage.get("completion_tokens") or 0
    return {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {
            "cached_tokens": details.get("cached_tokens") or 0,
            "cache_write_tokens": 0,
        },
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage["prompt_tokens"] + out,
    }


def _message(item_id: str, text: str, status: str = "completed", logprobs=None) -> dict:
    """A message item; ``logprobs``: its output text's per-token entries (chat's
    ``logprobs.content`` entries: token, logprob, bytes, top_logprobs, OpenAI's shape)."""
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [part]}  # fmt: skip


def _reasoning(item_id: str, text: str, status: str = "completed") -> dict:
    return {"type": "reasoning", "id": item_id, "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}]}  # fmt: skip


def _call(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed"):
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}  # fmt: skip


class OpenAIServingResponses:
    """Handler of ``POST /v1/responses`` over the server's chat handler."""

    def __init__(self, chat: OpenAIServingChat):
        self.chat = chat

    def _response(self, req: ResponsesRequest, rid: str, created: int, model: str,
                  output: list, finish: str | None, usage: dict | None) -> dict:  # fmt: skip
        """The ``response`` object (status from the chat finish reason)."""
        cut = finish == "length"
        return {
            "id": rid, "object": "response", "created_at": created, "model": model,
            "status": "incomplete" if cut else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "error": None, "output": output, "usage": _usage(usage),
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "temperature": req.temperature, "top_p": req.top_p, "tools": req.tools,
            "tool_choice": req.tool_choice, "parallel_tool_calls": req.parallel_tool_calls,
            "text": req.text or {"format": {"type": "text"}}, "metadata": req.metadata,
            "previous_response_id": None, "reasoning": req.reasoning, "store": False,
            "truncation": req.truncation, "user": req.user, "background": False,
        }  # fmt: skip

    async def create_response(self, req: ResponsesRequest, raw: Request | None):
        """A ``response`` object, an async iterator of SSE event strings, or None when the
        client went away.

        Raises:
            APIError: 400 / 404 (module docstring; and whatever the chat handler refuses).
        """
        chat_req = to_chat_request(req, req.stream)
        try:
            result = await self.chat.create_chat_completion(chat_req, raw, id_prefix="resp_")
        except APIError as e:  # named as this API names the field
            e.param, e.message = as_responses_error(e.param, e.message)
            raise
        if result is None:
            return None
        created = int(time.time())
        if req.stream:
            return self._events(req, result, created)
        body = result.model_dump()
        choice = body["choices"][0]
        msg = choice["message"]
        output = []
        if msg.get("reasoning"):
            output.append(_reasoning(_item_id("rs"), msg["reasoning"]))
        if msg.get("content"):
            lps = (choice.get("logprobs") or {}).get("content")
            output.append(_message(_item_id("msg"), msg["content"], logprobs=lps))
        for call in msg.get("tool_calls") or []:
            fn = call["function"]
            output.append(_call(_item_id("fc"), call["id"], fn["name"], fn["arguments"]))
        if output and choice["finish_reason"] == "length":
            output[-1]["status"] = "incomplete"  # the item max_output_tokens cut
        return self._response(req, body["id"], created, body["model"], output,
                              choice["finish_reason"], body["usage"])  # fmt: skip

    async def _events(self, req: ResponsesRequest, chunks: AsyncIterator[str],
                      created: int) -> AsyncIterator[str]:  # fmt: skip
        """The chat stream's chunks as Responses events (module docstring)."""
        w = _EventWriter()
        rid, model, finish, usage = None, None, None, None
        try:
            async for raw in chunks:
                if not raw.startswith("data: ") or raw.startswith("data: [DONE]"):
                    continue
                chunk = json.loads(raw[len("data: ") :])
                if "error" in chunk:
                    err = chunk["error"]
                    param, message = as_responses_error(err.get("param"), err.get("message", ""))
                    yield w.event("error", code=err.get("code"), message=message, param=param)
                    return
                if rid is None:
                    rid = chunk["id"]
                    model = chunk["model"]
                    head = {**self._response(req, rid, created, model, [], None, None),
                            "status": "in_progress"}  # fmt: skip
                    yield w.event("response.created", response=head)
                    yield w.event("response.in_progress", response=head)
                if chunk.get("usage") and not chunk["choices"]:
                    usage = chunk["usage"]
                for choice in chunk["choices"]:
                    lps = (choice.get("logprobs") or {}).get("content") or []
                    for piece in w.delta(choice.get("delta") or {}, lps):
                        yield piece
                    finish = choice.get("finish_reason") or finish
        finally:
            await chunks.aclose()  # a client gone: the chat stream aborts its request
        for piece in w.close(finish):
            yield piece
        if rid is not None:
            final = self._response(req, rid, created, model, w.output, finish, usage)
            done = "incomplete" if final["status"] == "incomplete" else "completed"
            yield w.event(f"response.{done}", response=final)


class _EventWriter:
    """Numbers the events of one stream and tracks its output items: the open one (its
    deltas so far) and those done (``output``)."""

    def __init__(self):
        self.seq = 0
        self.output: list[dict] = []
        self.item: dict[str, Any] | None = None  # {"kind", "index", "id", "text", ...}

    def event(self, kind: str, **fields) -> str:
        data = json.dumps({"type": kind, **fields, "sequence_number": self.seq})
        self.seq += 1
        return f"event: {kind}\ndata: {data}\n\n"

    def close(self, finish: str | None = None) -> list[str]:
        """The done events of the open item, which joins ``output`` (the item the budget
        cut, ``finish`` "length", is ``incomplete``)."""
        it, self.item = self.item, None
        if it is None:
            return []
        at = {"item_id": it["id"], "output_index": it["index"]}
        text = it["text"]
        status = "incomplete" if finish == "length" else "completed"
        if it["kind"] == "reasoning":
            item = _reasoning(it["id"], text, status)
            out = [self.event("response.reasoning_text.done", **at, content_index=0, text=text)]
        elif it["kind"] == "message":
            item = _message(it["id"], text, status, it["logprobs"])
            out = [
                self.event("response.output_text.done", **at, content_index=0, text=text,
                           logprobs=it["logprobs"]),
                self.event("response.content_part.done", **at, content_index=0,
                           part=item["content"][0]),
            ]  # fmt: skip
        else:
            item = _call(it["id"], it["call_id"], it["name"], text, status)
            out = [self.event("response.function_call_arguments.done", **at, arguments=text,
                              name=it["name"])]  # fmt: skip
        self.output.append(item)
        return [*out, self.event("response.output_item.done", output_index=it["index"], item=item)]

    def begin(self, kind: str, **extra) -> list[str]:
        """Close the open item and open one of ``kind`` (its added events)."""
        out = self.close()
        prefix = {"reasoning": "rs", "message": "msg", "function_call": "fc"}[kind]
        iid, idx = _item_id(prefix), len(self.output)
        self.item = {"kind": kind, "index": idx, "id": iid, "text": "", "logprobs": [], **extra}
        if kind == "reasoning":
            item = {**_reasoning(iid, ""), "status": "in_progress", "content": []}
        elif kind == "message":
            item = {**_message(iid, "", "in_progress"), "content": []}
        else:
            item = {**_call(iid, extra["call_id"], extra["name"], ""), "status": "in_progress"}
        out.append(self.event("response.output_item.added", output_index=idx, item=item))
        if kind == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(self.event("response.content_part.added", item_id=iid, output_index=idx,
                                  content_index=0, part=part))  # fmt: skip
        return out

    def _add(self, kind: str, event: str, text: str, **fields) -> list[str]:
        out = [] if self.item is not None and self.item["kind"] == kind else self.begin(kind)
        self.item["text"] += text
        at = {"item_id": self.item["id"], "output_index": self.item["index"]}
        return [*out, self.event(event, **at, **fields)]

    def delta(self, delta: dict, logprobs: list | None = None) -> list[str]:
        """The events of one chat delta: reasoning, content, tool-call pieces; ``logprobs``:
        the chunk's per-token entries, carried by its output-text delta."""
        out = []
        if delta.get("reasoning"):
            text = delta["reasoning"]
            out += self._add("reasoning", "response.reasoning_text.delta", text,
                             content_index=0, delta=text)  # fmt: skip
        if delta.get("content"):
            text = delta["content"]
            out += self._add("message", "response.output_text.delta", text, content_index=0,
                             delta=text, logprobs=logprobs or [])  # fmt: skip
            self.item["logprobs"] += logprobs or []
        for call in delta.get("tool_calls") or []:
            fn = call.get("function") or {}
            if call.get("id"):  # a new call
                out += self.begin("function_call", call_id=call["id"], name=fn.get("name"))
            if fn.get("arguments") and self.item is not None:
                text = fn["arguments"]
                out += self._add("function_call", "response.function_call_arguments.delta",
                                 text, delta=text)  # fmt: skip
        return out
