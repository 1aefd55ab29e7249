"""The checks of a chat request's tool_choice: "auto" without ``tools`` is a 400 naming
``tools`` (as upstream and OpenAI answer it), and a tool_choice of neither form is one
400 with param ``tool_choice`` saying what is accepted."""

import json

import pytest

from vllm.entrypoints.openai.api_errors import APIError
from vllm.entrypoints.openai.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.tool_calls import tool_mode
from vllm.entrypoints.openai.tool_parsers import get_tool_parser

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
MSGS = [{"role": "user", "content": "Weather?"}]


def _req(**kw):
    return ChatCompletionRequest(messages=MSGS, **kw)


@pytest.mark.parametrize("parser", [None, "hermes"])
def test_auto_without_tools_is_refused(parser):
    """tool_choice "auto" in a request without ``tools`` (absent or null) is a 400 naming
    ``tools``, as upstream and OpenAI answer it, with or without a parser."""
    p = get_tool_parser(parser) if parser else None
    for req in (_req(tool_choice="auto"), _req(tool_choice="auto", tools=None)):
        with pytest.raises(APIError) as exc:
            tool_mode(req, p)
        assert (exc.value.code, exc.value.param) == (400, "tools")
        assert 'tool_choice="auto" needs tools' in exc.value.message


@pytest.mark.parametrize(
    "choice",
    ["any", 5, {"type": "function"}, {"type": "function", "function": {"name": 5}},
     {"type": "x", "function": {"name": "get_weather"}}],
)  # fmt: skip
def test_a_tool_choice_of_neither_form_is_one_clear_error(choice):
    """A tool_choice that is neither a known string nor a named function is one 400 with
    param ``tool_choice`` (the server's message, built by validation_message); the union's
    own errors named its member tags (``tool_choice.literal[...]``,
    ``function-wrap[_warn_ignored_keys()]``)."""
    from pydantic import ValidationError

    from vllm.entrypoints.openai.request_guards import validation_message

    body = {"messages": MSGS, "tools": TOOLS, "tool_choice": choice}
    with pytest.raises(ValidationError) as exc:
        ChatCompletionRequest.model_validate(body)
    msg, param = validation_message([{**e, "loc": ("body", *e["loc"])} for e in exc.value.errors()])
    assert param == "tool_choice"
    got = json.dumps(choice)
    assert msg == (
        'tool_choice: tool_choice must be "none", "auto", "required" or {"type": "function", '
        f'"function": {{"name": NAME}}}}; got {got}.'
    )
    named = {"type": "function", "function": {"name": "get_weather"}}
    for ok in ("none", "auto", "required", named, {"function": {"name": "get_weather"}}):
        assert ChatCompletionRequest.model_validate({**body, "tool_choice": ok}).tool_choice
