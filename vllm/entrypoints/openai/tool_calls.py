"""Chat tool calls (OpenAI's ``tools`` / ``tool_choice``).

- A named function (``{"type": "function", "function": {"name": ...}}``): the output is
  constrained to that function's ``parameters`` JSON schema (no ``parameters``, or ``{}``:
  the empty object, as OpenAI defines such a function) and returned as one tool call
  whose ``arguments`` is the generated text; finish reason as generated ("stop").
- "required": the output is constrained to a JSON array (at least one item) of
  ``{"name": <one of the tools>, "parameters": <that tool's schema>}``, parsed into one
  tool call per item; finish reason "tool_calls".
- "auto" (the default when tools are given and the server runs with
  ``--enable-auto-tool-choice --tool-call-parser NAME``): no constraint; the server's
  parser (tool_parsers/) finds the calls in the model's text; finish reason "tool_calls"
  when it found any. Without those flags "auto" with tools is refused; "auto" in a
  request without a ``tools`` field is refused whatever the flags.
- "none" (the default otherwise): no constraint and no parsing.
The tools are variables of the chat template whatever the choice. With
``parallel_tool_calls: false`` a choice has at most one call: "required" constrains the
array to one item, and "auto" keeps the first call the parser found (streamed or not).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from vllm.entrypoints.openai.api_errors import APIError
from vllm.entrypoints.openai.guided_request import guided_field
from vllm.entrypoints.openai.protocol import (
    ChatCompletionNamedToolChoiceParam,
    ChatCompletionRequest,
    ChatCompletionToolsParam,
    FunctionCall,
    ToolCall,
)
from vllm.entrypoints.openai.tool_parsers import ToolParser
from vllm.sampling_params import GuidedDecodingParams

# The schema of a function without ``parameters`` (or with ``{}``): OpenAI's "empty
# parameter list", so a forced call's arguments are ``{}`` (an open object let the model
# invent arguments until max_tokens).
_NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass
class ToolMode:
    """How a chat request's output becomes tool calls.

    Attributes:
        function: the forced function's name (named tool choice), else None.
        required: tool_choice "required" (a JSON array of calls).
        parser: tool_choice "auto": the parser that finds calls in the text.
        single: ``parallel_tool_calls`` false: at most one call (the first) per choice.
        ids: the server's parser (``--tool-call-parser``), whose :meth:`ToolParser.call_id`
            names "required" and named calls too; None: upstream's default ids.
        tools: "auto": the request's ``tools``, which the parser gets with the text
            (:meth:`ToolParser.extract_for`: the one parser instance serves every request).
    """

    function: str | None = None
    required: bool = False
    parser: ToolParser | None = None
    single: bool = False
    ids: ToolParser | None = None
    tools: list[ChatCompletionToolsParam] | None = None

    def call_id(self) -> str:
        """A fresh id for one of this mode's calls."""
        return (self.ids or self.parser or ToolParser()).call_id()

    @property
    def active(self) -> bool:
        """Whether the output may become tool calls."""
        return self.function is not None or self.required or self.parser is not None

    def finish_reason(self, finish: str | None, called: bool) -> str | None:
        """The choice's finish reason once its output made tool calls (``called``)."""
        if called and (self.parser is not None or (self.required and finish == "stop")):
            return "tool_calls"
        return finish


def tool_mode(
    req: ChatCompletionRequest, auto_parser: ToolParser | None = None
) -> tuple[ToolMode, GuidedDecodingParams | None]:
    """The request's tool mode and the constraint it implies (None: unconstrained).

    Args:
        auto_parser: the server's parser for tool_choice "auto" (None: not enabled).
    Raises:
        APIError 400: tool_choice names a function that is not in ``tools``, asks for
            tools when none are given (also "auto" without a ``tools`` field, as upstream
            and OpenAI refuse it; an empty list is nothing to call), is "auto" with tools
            on a server without a parser, or is combined with another constraint.
    """
    choice = req.tool_choice
    single = req.parallel_tool_calls is False
    if choice is None:
        choice = "auto" if req.tools and auto_parser is not None else "none"
    if choice == "auto" and req.tools is None:
        raise APIError(
            'tool_choice="auto" needs tools: send the functions the model may call, or leave '
            "tool_choice out.",
            400,
            "tools",
        )
    if choice == "none" or (choice == "auto" and not req.tools):
        return ToolMode(), None
    if choice == "auto":
        if auto_parser is None:
            raise APIError(
                'tool_choice "auto" with tools requires the server to run with '
                "--enable-auto-tool-choice and --tool-call-parser; send tool_choice "
                '"none", "required" or a named function instead.',
                400,
                "tool_choice",
            )
        return ToolMode(parser=auto_parser, single=single, tools=req.tools), None
    tools = {t.function.name: t.function for t in req.tools or []}
    if not tools:
        raise APIError(f"tool_choice={_show(choice)} needs a non-empty tools list.", 400, "tools")
    other = guided_field(req)
    if other is not None:
        raise APIError(
            f"tool_choice other than 'none' / 'auto' cannot be combined with {other}: the "
            "forced call's arguments are already constrained to the tool's parameters "
            "(response_format, structured_outputs and guided_json / guided_regex / "
            "guided_choice / guided_grammar are not combined with it).",
            400,
            "tool_choice",
        )
    if isinstance(choice, ChatCompletionNamedToolChoiceParam):
        fn = tools.get(choice.function.name)
        if fn is None:
            raise APIError(
                f"tool_choice names function {choice.function.name!r}, which is not in tools "
                f"({sorted(tools)}).",
                400,
                "tool_choice",
            )
        schema = fn.parameters or _NO_PARAMETERS
        return ToolMode(function=fn.name, ids=auto_parser), _guided(schema, req)
    items = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [name]},
                "parameters": fn.parameters or _NO_PARAMETERS,
            },
            "required": ["name", "parameters"],
        }
        for name, fn in tools.items()
    ]
    schema = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
    if single:
        schema["maxItems"] = 1
    return ToolMode(required=True, single=single, ids=auto_parser), _guided(schema, req)


def _guided(schema: dict, req: ChatCompletionRequest) -> GuidedDecodingParams:
    try:
        return GuidedDecodingParams(json=schema, backend=req.guided_decoding_backend)
    except ValueError as e:
        raise APIError(str(e), 400, "tools") from None


def _show(choice) -> str:
    return choice if isinstance(choice, str) else choice.model_dump_json()


def parse_tool_calls(mode: ToolMode, text: str) -> tuple[list[ToolCall] | None, str | None]:
    """The tool calls of a finished output and the message content that goes with them.
    A named function's call is the whole text, as streamed (its arguments cut short when
    max_tokens cut the reply, as upstream). Otherwise no calls (None) when the text is not
    a complete call (e.g. cut by max_tokens): the content is then the whole text. With
    ``mode.single`` only the parser's first call is kept. "required" calls' arguments are
    re-encoded keeping non-ASCII characters as they are (as the parsers and upstream do)."""
    if mode.parser is not None:
        found = mode.parser.extract_for(text, mode.tools)
        if not found.calls:
            return None, text
        return (found.calls[:1] if mode.single else found.calls), found.content
    calls = _forced_calls(mode, text)
    if calls is None:
        return None, text
    return (calls[:1] if mode.single else calls), None


def _forced_calls(mode: ToolMode, text: str) -> list[ToolCall] | None:
    if mode.function is not None:  # the arguments as generated, complete JSON or not
        fn = FunctionCall(name=mode.function, arguments=text)
        return [ToolCall(id=mode.call_id(), function=fn)]
    try:
        calls = json.loads(text)
        return [
            ToolCall(
                id=mode.call_id(),
                function=FunctionCall(
                    name=c["name"], arguments=json.dumps(c["parameters"], ensure_ascii=False)
                ),
            )
            for c in calls
        ]
    except (ValueError, TypeError, KeyError, RecursionError):
        return None


class ToolCallStream:
    """Turns one choice's streamed text into tool-call deltas.

    Named function: the first delta carries the call's id, type and name, and every delta
    carries the new argument text (a token that adds none, such as one of the reasoning
    before the arguments, sends no delta until the finish). "required": the text is held
    until the choice finishes, then each parsed call is sent whole as one delta (arguments
    are re-encoded from the parsed array, so they cannot be streamed as generated); text
    that does not parse is sent as content. "auto": the text the parser calls content
    streams as it comes; the rest is held and parsed at the finish, its calls sent whole in
    one delta with the content that follows them (calls are not parsed incrementally).
    """

    def __init__(self, mode: ToolMode):
        self.mode = mode
        self._id: str | None = None
        self._held: list[str] = []
        self._sent = 0  # "auto": characters already sent as content

    def delta(self, text: str, finished: bool) -> dict:
        """DeltaMessage fields (``content`` / ``tool_calls``) for new ``text``."""
        from vllm.entrypoints.openai.protocol import DeltaFunctionCall, DeltaToolCall

        if self.mode.function is not None:
            if not text and not finished:
                return {}  # nothing to add (a reasoning token, a partial character)
            if self._id is None:
                self._id = self.mode.call_id()
                fn = DeltaFunctionCall(name=self.mode.function, arguments=text)
                call = DeltaToolCall(index=0, id=self._id, type="function", function=fn)
            else:
                call = DeltaToolCall(index=0, function=DeltaFunctionCall(arguments=text))
            return {"tool_calls": [call]}
        self._held.append(text)
        if self.mode.parser is not None and not finished:
            whole = "".join(self._held)
            cut = max(self._sent, self.mode.parser.content_prefix(whole))
            new, self._sent = whole[self._sent : cut], cut
            return {"content": new} if new else {}
        if not finished:
            return {}
        whole = "".join(self._held)
        calls, content = parse_tool_calls(self.mode, whole)
        rest = (content or "")[self._sent :]
        if calls is None:
            return {"content": rest} if rest else {}
        fields = {"content": rest} if rest else {}
        return {
            **fields,
            "tool_calls": [
                DeltaToolCall(
                    index=j,
                    id=c.id,
                    type="function",
                    function=DeltaFunctionCall(
                        name=c.function.name, arguments=c.function.arguments
                    ),
                )
                for j, c in enumerate(calls)
            ],
        }
