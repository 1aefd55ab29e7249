"""Chat tool calls by constrained decoding (OpenAI's ``tools`` / ``tool_choice``).

- A named function (``{"type": "function", "function": {"name": ...}}``): the output is
  constrained to that function's ``parameters`` JSON schema and returned as one tool call
  whose ``arguments`` is the generated text; finish reason as generated ("stop").
- "required": the output is constrained to a JSON array (at least one item) of
  ``{"name": <one of the tools>, "parameters": <that tool's schema>}``, parsed into one
  tool call per item; finish reason "tool_calls".
- "auto" and "none": no constraint and no parsing; the model's text is the message
  content (a model-specific tool-call parser is not implemented).
Tools are not passed to the chat template.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from vllm.entrypoints.openai.protocol import (
    ChatCompletionNamedToolChoiceParam,
    ChatCompletionRequest,
    FunctionCall,
    ToolCall,
)
from vllm.entrypoints.openai.serving_engine import APIError
from vllm.sampling_params import GuidedDecodingParams

# The schema of a function without ``parameters``.
_ANY_OBJECT = {"type": "object"}


@dataclass
class ToolMode:
    """How a chat request's output becomes tool calls.

    Attributes:
        function: the forced function's name (named tool choice), else None.
        required: tool_choice "required" (a JSON array of calls).
    """

    function: str | None = None
    required: bool = False

    @property
    def active(self) -> bool:
        return self.function is not None or self.required


def tool_mode(req: ChatCompletionRequest) -> tuple[ToolMode, GuidedDecodingParams | None]:
    """The request's tool mode and the constraint it implies (None: unconstrained).

    Raises:
        APIError 400: tool_choice names a function that is not in ``tools``, asks for
            tools when none are given, or is combined with another constraint.
    """
    choice = req.tool_choice
    if choice is None or choice in ("none", "auto"):
        return ToolMode(), None
    tools = {t.function.name: t.function for t in req.tools or []}
    if not tools:
        raise APIError(f"tool_choice={_show(choice)} needs a non-empty tools list.", 400, "tools")
    if req.response_format is not None and req.response_format.type != "text":
        raise APIError(
            "tool_choice other than 'none' / 'auto' cannot be combined with response_format.",
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
        schema = fn.parameters or _ANY_OBJECT
        return ToolMode(function=fn.name), _guided(schema, req)
    items = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [name]},
                "parameters": fn.parameters or _ANY_OBJECT,
            },
            "required": ["name", "parameters"],
        }
        for name, fn in tools.items()
    ]
    schema = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
    return ToolMode(required=True), _guided(schema, req)


def _guided(schema: dict, req: ChatCompletionRequest) -> GuidedDecodingParams:
    try:
        return GuidedDecodingParams(json=schema, backend=req.guided_decoding_backend)
    except ValueError as e:
        raise APIError(str(e), 400, "tools") from None


def _show(choice) -> str:
    return choice if isinstance(choice, str) else choice.model_dump_json()


def parse_tool_calls(mode: ToolMode, text: str) -> list[ToolCall] | None:
    """The tool calls of a finished output; None when the text is not a complete call
    (e.g. cut by max_tokens), in which case it is returned as content."""
    if mode.function is not None:
        try:
            json.loads(text)
        except ValueError:
            return None
        return [ToolCall(function=FunctionCall(name=mode.function, arguments=text))]
    try:
        calls = json.loads(text)
        return [
            ToolCall(function=FunctionCall(name=c["name"], arguments=json.dumps(c["parameters"])))
            for c in calls
        ]
    except (ValueError, TypeError, KeyError):
        return None


class ToolCallStream:
    """Turns one choice's streamed text into tool-call deltas.

    Named function: the first delta carries the call's id, type and name, and every delta
    carries the new argument text. "required": the text is held until the choice
    finishes, then each parsed call is sent whole as one delta (arguments are re-encoded
    from the parsed array, so they cannot be streamed as generated); text that does not
    parse is sent as content.
    """

    def __init__(self, mode: ToolMode):
        self.mode = mode
        self._id: str | None = None
        self._held: list[str] = []

    def delta(self, text: str, finished: bool) -> dict:
        """DeltaMessage fields (``content`` / ``tool_calls``) for new ``text``."""
        from vllm.entrypoints.openai.protocol import DeltaFunctionCall, DeltaToolCall

        if self.mode.function is not None:
            if self._id is None:
                self._id = ToolCall(function=FunctionCall(name="", arguments="")).id
                fn = DeltaFunctionCall(name=self.mode.function, arguments=text)
                call = DeltaToolCall(index=0, id=self._id, type="function", function=fn)
            else:
                call = DeltaToolCall(index=0, function=DeltaFunctionCall(arguments=text))
            return {"tool_calls": [call]}
        self._held.append(text)
        if not finished:
            return {}
        whole = "".join(self._held)
        calls = parse_tool_calls(self.mode, whole)
        if calls is None:
            return {"content": whole}
        return {
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
            ]
        }
