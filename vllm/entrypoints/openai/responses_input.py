"""The Responses API's request (``POST /v1/responses``, OpenAI's newer API) and its
translation into the Chat Completions request this server already serves.

What maps where (the conversation is rendered with the model's chat template, as chat):

- ``instructions`` -> a first ``system`` message; ``input`` a string -> one ``user``
  message; ``input`` a list of items -> messages: ``{"role", "content"}`` items (``type``
  "message" or none; ``developer`` becomes ``system``; content a string or a list of
  ``input_text`` / ``output_text`` parts), ``function_call`` items -> an assistant message
  with ``tool_calls`` (consecutive calls together), ``function_call_output`` -> a ``tool``
  message; ``reasoning`` items are dropped (the template gets the answer only).
- ``max_output_tokens`` -> ``max_tokens``; ``temperature``, ``top_p`` and vLLM's extras
  (``top_k``, ``min_p``, ``repetition_penalty``, ``seed``, ``priority``,
  ``ignore_eos``, ``request_id``, ``structured_outputs``, ``guided_decoding_backend``) as
  given.
- ``tools`` (``{"type": "function", "name", "description", "parameters"}``) and
  ``tool_choice`` (``"auto"``, ``"none"``, ``"required"`` or ``{"type": "function",
  "name"}``) -> chat's nested forms, ``parallel_tool_calls`` as given (false: at most one
  ``function_call`` item); ``text.format`` (``text``, ``json_object``,
  ``json_schema`` with ``name`` / ``schema`` / ``strict``) -> ``response_format``.

Refused with a 400 naming the field: ``previous_response_id``, ``conversation`` and
``background`` (this server stores no responses), a forced ``tool_choice`` without tools,
image / file / audio input parts, and tools other than functions. ``store``,
``metadata``, ``include``, ``reasoning``, ``truncation`` and ``user`` are accepted;
``metadata`` is echoed back, nothing is stored.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from vllm.entrypoints.openai.api_errors import APIError
from vllm.entrypoints.openai.protocol import ChatCompletionRequest, OpenAIRequest
from vllm.entrypoints.openai.request_guards import validation_message

_TEXT_PARTS = ("input_text", "output_text", "text")
_PASSED = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "priority",
           "user", "request_id", "ignore_eos", "structured_outputs",
           "guided_decoding_backend", "cache_salt", "parallel_tool_calls")  # fmt: skip


class ResponsesRequest(OpenAIRequest):
    """The body of ``POST /v1/responses`` (the fields this server reads)."""

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[dict[str, Any]] = []
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    text: dict[str, Any] | None = None
    stream: bool = False
    store: bool = True
    background: bool = False
    previous_response_id: str | None = None
    conversation: Any = None
    metadata: dict[str, Any] | None = None
    include: list[str] | None = None
    top_logprobs: int | None = None
    reasoning: dict[str, Any] | None = None
    truncation: str | None = "disabled"
    user: str | None = None
    # vLLM's extras
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    priority: int = 0
    request_id: str | None = None
    ignore_eos: bool = False
    structured_outputs: dict[str, Any] | None = None
    guided_decoding_backend: str | None = None
    cache_salt: str | None = None


def _content(content: Any, where: str) -> str | list[dict[str, str]]:
    """A message item's content as chat content: a string, or text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(f"{where}.content must be a string or a list of parts.", 400, "input")
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise APIError(
                f"{where}.content[{j}] of type {kind!r} is not supported: only text parts "
                f"({', '.join(_TEXT_PARTS)}) are served.",
                400,
                "input",
            )
        parts.append({"type": "text", "text": part["text"]})
    return parts


def chat_messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The conversation of ``req`` as chat messages (module docstring).

    Raises:
        APIError 400 naming ``input``: an item of an unknown type or role, a non-text
            part, a function call or output without its fields.
    """
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    items = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("system", "developer", "user", "assistant"):
                raise APIError(
                    f"{where}.role {role!r} is not known (system, developer, user, assistant).",
                    400,
                    "input",
                )
            role = "system" if role == "developer" else role
            messages.append({"role": role, "content": _content(item.get("content"), where)})
        elif kind == "function_call":
            fn = {"name": item.get("name"), "arguments": item.get("arguments")}
            call = {"id": item.get("call_id"), "type": "function", "function": fn}
            if not all(isinstance(v, str) for v in (call["id"], *call["function"].values())):
                raise APIError(f"{where} needs call_id, name and arguments strings.", 400,
                               "input")  # fmt: skip
            last = messages[-1] if messages else None
            if last and last["role"] == "assistant" and last.get("tool_calls") is not None:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise APIError(f"{where} needs a call_id string.", 400, "input")
            output = item.get("output")
            text = output if isinstance(output, str) else _content(output, where)
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
        elif kind != "reasoning":
            raise APIError(f"{where} of type {kind!r} is not supported.", 400, "input")
    return messages


def _tools(req: ResponsesRequest) -> tuple[list | None, Any]:
    """Chat's ``tools`` and ``tool_choice`` of ``req``."""
    tools = []
    for i, tool in enumerate(req.tools):
        if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            raise APIError(
                f"tools[{i}] of type {tool.get('type')!r} is not supported: only function "
                "tools (with a name) are served.",
                400,
                "tools",
            )
        fields = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        tools.append({"type": "function", "function": fields})
    choice = req.tool_choice
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise APIError(f"tool_choice {choice!r} is not supported.", 400, "tool_choice")
        choice = {"type": "function", "function": {"name": choice["name"]}}
    elif choice not in ("auto", "none", "required"):
        raise APIError(
            f'tool_choice must be "auto", "none", "required" or {{"type": "function", "name": '
            f"NAME}}; got {choice!r}.",
            400,
            "tool_choice",
        )
    if not tools and choice not in ("auto", "none"):
        raise APIError(
            f"tool_choice {req.tool_choice!r} needs a non-empty tools list.", 400, "tool_choice"
        )
    return (tools or None), (choice if tools else None)


def _response_format(req: ResponsesRequest) -> dict[str, Any] | None:
    fmt = (req.text or {}).get("format")
    if fmt is not None and not isinstance(fmt, dict):
        raise APIError(f"text.format must be an object, got {fmt!r}.", 400, "text")
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise APIError(f"text.format type {fmt.get('type')!r} is not supported.", 400, "text")


# The ``include`` entry that asks for the output text's per-token logprobs.
LOGPROBS_INCLUDE = "message.output_text.logprobs"


def wants_logprobs(req: ResponsesRequest) -> bool:
    """Whether the output text carries per-token logprobs: ``include`` names
    :data:`LOGPROBS_INCLUDE` or ``top_logprobs`` is set (its count of alternatives, 0 by
    default)."""
    return LOGPROBS_INCLUDE in (req.include or ()) or req.top_logprobs is not None


def to_chat_request(req: ResponsesRequest, stream: bool) -> ChatCompletionRequest:
    """The chat request that serves ``req`` (``stream``: with the usage chunk).

    Raises:
        APIError 400: what :func:`chat_messages` refuses, ``previous_response_id``,
            ``background``, a non-function tool or an unknown ``text.format``.
    """
    if req.previous_response_id is not None:
        raise APIError(
            "previous_response_id is not supported: this server stores no responses; send "
            "the conversation in input.",
            400,
            "previous_response_id",
        )
    if req.background:
        raise APIError("background responses are not supported.", 400, "background")
    if req.conversation is not None:
        raise APIError(
            "conversation is not supported: this server stores no conversations; send the "
            "conversation in input.",
            400,
            "conversation",
        )
    if req.max_output_tokens is not None and req.max_output_tokens < 1:
        raise APIError(
            f"max_output_tokens must be at least 1, got {req.max_output_tokens}.",
            400,
            "max_output_tokens",
        )
    tools, choice = _tools(req)
    body: dict[str, Any] = {
        "model": req.model,
        "messages": chat_messages(req),
        "max_tokens": req.max_output_tokens,
        "tools": tools,
        "tool_choice": choice,
        "response_format": _response_format(req),
        "stream": stream,
        **{k: getattr(req, k) for k in _PASSED if getattr(req, k) is not None},
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if wants_logprobs(req):
        body["logprobs"], body["top_logprobs"] = True, req.top_logprobs or 0
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:  # a message's shape, say: named as chat names it
        errs = [{**err, "loc": ("body", *err["loc"])} for err in e.errors()]
        msg, param = validation_message(errs)
        raise APIError(msg, 400, param) from None
