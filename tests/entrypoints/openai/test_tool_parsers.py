"""Tool-call parsers for tool_choice "auto" (deepseek_v3, deepseek_v31, glm45, hermes,
llama3_json, mistral, pythonic) on text, the registry that picks them by name, the "auto"
default and refusal in tool_mode (which hands the parser the request's tools), and the
streamed deltas of an "auto" choice (content as it comes, calls whole at the finish); a
reply nested deeper than the decoders follow is content."""

import json

import pytest

from vllm.entrypoints.openai.api_errors import APIError
from vllm.entrypoints.openai.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.tool_calls import ToolCallStream, ToolMode, tool_mode
from vllm.entrypoints.openai.tool_parsers import get_tool_parser, tool_parser_names

WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}'
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
MSGS = [{"role": "user", "content": "Weather?"}]


def _calls(found):
    return [(c.function.name, json.loads(c.function.arguments)) for c in found.calls]


def test_registry_lists_and_refuses_unknown_names():
    assert tool_parser_names() == [
        "deepseek_v3",
        "deepseek_v31",
        "glm45",
        "hermes",
        "llama3_json",
        "mistral",
        "pythonic",
    ]
    assert get_tool_parser("hermes").name == "hermes"
    with pytest.raises(ValueError) as exc:
        get_tool_parser("granite")
    assert str(exc.value) == (
        "--tool-call-parser 'granite' is not a known parser; choose one of deepseek_v3, "
        "deepseek_v31, glm45, hermes, llama3_json, mistral, pythonic."
    )


def test_hermes_blocks_become_calls_and_the_rest_content():
    p = get_tool_parser("hermes")
    text = f"Let me check.\n<tool_call>\n{WEATHER}\n</tool_call>\n"
    text += '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    found = p.extract(text)
    assert _calls(found) == [
        ("get_weather", {"city": "Paris", "unit": "c"}),
        ("get_time", {}),
    ]
    assert found.content == "Let me check.\n"
    assert found.calls[0].id.startswith("chatcmpl-tool-")
    assert found.calls[0].function.arguments == '{"city": "Paris", "unit": "c"}'
    only = p.extract(f"<tool_call>{WEATHER}</tool_call>\n")
    assert len(only.calls) == 1 and only.content is None
    # no block, an unclosed block (cut by max_tokens), a body that is not a call: content
    for plain in ["Paris is sunny.", f"<tool_call>{WEATHER}", "<tool_call>[1]</tool_call>"]:
        found = p.extract(plain)
        assert found.calls == [] and found.content == plain


def test_hermes_content_prefix_holds_what_may_start_a_call():
    p = get_tool_parser("hermes")
    assert p.content_prefix("Hello") == 5
    assert p.content_prefix("Hello <tool") == 6
    assert p.content_prefix("Hello <tools are") == 16
    assert p.content_prefix("Hi<tool_call>{") == 2
    assert p.content_prefix("\n ") == 0  # whitespace alone may be no content at all


def test_llama3_json_objects_separated_by_semicolons():
    p = get_tool_parser("llama3_json")
    text = ' {"name": "get_weather", "parameters": {"city": "Paris"}}; '
    text += '{"name": "get_time", "arguments": {"zone": "utc"}}\n'
    found = p.extract(text)
    assert _calls(found) == [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "utc"})]
    assert found.content is None
    for plain in [
        "The weather is nice.",
        '{"name": "get_weather", "parameters": {"city": "Paris"}} and more',
        '{"name": "get_weather"}',
        '{"name": "get_weather", "parameters": {"city": ',
    ]:
        found = p.extract(plain)
        assert found.calls == [] and found.content == plain
    assert p.content_prefix("  ") == 0 and p.content_prefix(' {"na') == 0
    assert p.content_prefix(" The") == 4


def _req(**kw):
    return ChatCompletionRequest(messages=MSGS, **kw)


def test_auto_is_the_default_only_with_a_parser_and_refused_without_one():
    hermes = get_tool_parser("hermes")
    assert tool_mode(_req(tools=TOOLS), hermes)[0].parser is hermes
    req = _req(tools=TOOLS, tool_choice="auto")
    assert tool_mode(req, hermes) == (ToolMode(parser=hermes, tools=req.tools), None)
    assert not tool_mode(_req(tools=TOOLS, tool_choice="none"), hermes)[0].active
    assert not tool_mode(_req(tools=TOOLS), None)[0].active  # no parser: "none"
    assert not tool_mode(_req(tool_choice="auto", tools=[]), hermes)[0].active  # nothing to call
    with pytest.raises(APIError) as exc:
        tool_mode(_req(tools=TOOLS, tool_choice="auto"), None)
    assert exc.value.code == 400 and exc.value.param == "tool_choice"
    assert "--enable-auto-tool-choice and --tool-call-parser" in exc.value.message


def test_parsers_get_the_requests_tools_and_extract_only_parsers_still_work():
    """The server parses through extract_for(text, tools), with the request's tools; a
    parser written against extract(text) alone (a --tool-parser-plugin file's) is called
    through the default extract_for, streamed or not."""
    from vllm.entrypoints.openai.tool_calls import parse_tool_calls
    from vllm.entrypoints.openai.tool_parsers import ExtractedToolCalls, ToolParser
    from vllm.entrypoints.openai.tool_parsers.abstract import make_call

    class Upper(ToolParser):  # a plugin-style parser: no extract_for of its own
        def extract(self, text):
            if not text.startswith("CALL "):
                return ExtractedToolCalls(content=text)
            return ExtractedToolCalls(calls=[make_call(text[5:], {})])

        def content_prefix(self, text):
            return 0

    seen = []

    class Spy(Upper):
        def extract_for(self, text, tools):
            seen.append(tools)
            return super().extract_for(text, tools)

    for parser in (Upper(), Spy()):
        mode, _ = tool_mode(_req(tools=TOOLS), parser)
        [call] = parse_tool_calls(mode, "CALL get_weather")[0]
        assert (call.function.name, call.function.arguments) == ("get_weather", "{}")
        [last] = _stream(mode, ["CALL ", "get_weather"])[1:]
        assert [c.function.name for c in last["tool_calls"]] == ["get_weather"]
        assert parse_tool_calls(mode, "no call") == (None, "no call")
    assert len(seen) == 3 and all(t is not None for t in seen)
    assert [t.function.name for t in seen[0]] == ["get_weather"]


def _stream(mode, pieces):
    s = ToolCallStream(mode)
    return [s.delta(p, i == len(pieces) - 1) for i, p in enumerate(pieces)]


def test_auto_stream_sends_content_as_it_comes_and_calls_at_the_finish():
    mode = ToolMode(parser=get_tool_parser("hermes"))
    pieces = ["Sure", ", checking", ". <tool", "_call>", WEATHER[:20], WEATHER[20:], "</tool_call>"]
    deltas = _stream(mode, pieces)
    assert [d.get("content") for d in deltas[:4]] == ["Sure", ", checking", ". ", None]
    assert deltas[3:6] == [{}, {}, {}]
    last = deltas[-1]
    assert "content" not in last
    [call] = last["tool_calls"]
    assert (call.index, call.type, call.function.name) == (0, "function", "get_weather")
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "c"}
    assert call.id.startswith("chatcmpl-tool-")
    assert mode.finish_reason("stop", True) == "tool_calls"
    assert mode.finish_reason("stop", False) == "stop"
    # no call: every piece streams as content and they join to the text
    deltas = _stream(mode, ["It is ", "<b>sunny", "</b>."])
    assert "".join(d.get("content", "") for d in deltas) == "It is <b>sunny</b>."
    # an unclosed block is content, sent whole at the finish
    deltas = _stream(mode, ["A", "<tool_call>", "{"])
    assert deltas == [{"content": "A"}, {}, {"content": "<tool_call>{"}]


def test_mistral_array_and_named_forms():
    p = get_tool_parser("mistral")
    assert p.keeps_special_tokens  # [TOOL_CALLS] is a special token
    arr = 'Checking.[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, ' \
          '{"name": "get_time", "arguments": {}}]'  # fmt: skip
    found = p.extract(arr)
    assert _calls(found) == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert found.content == "Checking."
    named = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time{}'
    found = p.extract(named)
    assert _calls(found) == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert found.content is None
    # no tag, a cut array, a body that is no call: all content
    for plain in ["Paris is sunny.", '[TOOL_CALLS][{"name": "get_weather", "argu',
                  "[TOOL_CALLS]not a call", "[TOOL_CALLS][1, 2]"]:  # fmt: skip
        found = p.extract(plain)
        assert found.calls == [] and found.content == plain
    assert p.content_prefix("Hello [TOOL") == 6
    assert p.content_prefix("Hello") == 5 and p.content_prefix("[TOOL_CALLS][") == 0


def test_pythonic_list_of_calls():
    p = get_tool_parser("pythonic")
    text = '[get_weather(city="Paris", days=3, units=None), get_time(), note(tags=["a", 1])]'
    found = p.extract(text)
    assert _calls(found) == [("get_weather", {"city": "Paris", "days": 3, "units": None}),
                             ("get_time", {}), ("note", {"tags": ["a", 1]})]  # fmt: skip
    assert found.content is None
    # prose, a cut list, positional or computed arguments, an empty list: content
    for plain in ["Paris is sunny.", '[get_weather(city="Par', '[get_weather("Paris")]',
                  "[f(x=open('y'))]", "[]", "[1, 2]"]:  # fmt: skip
        found = p.extract(plain)
        assert found.calls == [] and found.content == plain
    assert p.content_prefix("Sure: [x()]") == 11 and p.content_prefix(" [get") == 0


@pytest.mark.parametrize(
    "text",
    [
        "[f(z=2j)]",  # a complex number: a literal JSON cannot write
        "[f(tags={3, [5]})]",  # a set holding a list: literal_eval raises TypeError
        "[f(tags={1, 2})]",  # a set
        "[f(d={(1, 2): 3})]",  # a tuple key
        "[f(x=b'raw')]",  # bytes
        "[f(x=...)]",  # Ellipsis
        "[get_time(), f(z=1+2j)]",  # one bad call makes the whole list content
        "[f(a=1e999)]",  # infinity: strict JSON has no literal for it
    ],
)
def test_pythonic_values_json_cannot_hold_are_content(text):
    """Regression: a call whose literal arguments cannot become JSON raised (HTTP 500)
    instead of leaving the reply as content; streamed, the finish parses the same way."""
    found = get_tool_parser("pythonic").extract(text)
    assert found.calls == [] and found.content == text
    mode = ToolMode(parser=get_tool_parser("pythonic"))
    deltas = _stream(mode, [text[:3], text[3:]])
    assert deltas == [{}, {"content": text}]


def test_mistral_call_ids_are_nine_letters_and_digits():
    """Regression: mistral calls had ``chatcmpl-tool-<hex>`` ids, which Mistral's
    templates and mistral-common refuse when the calls are sent back; streamed too."""
    text = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time{}'
    ids = [c.id for c in get_tool_parser("mistral").extract(text).calls]
    [last] = _stream(ToolMode(parser=get_tool_parser("mistral")), [text[:20], text[20:]])[1:]
    ids += [c.id for c in last["tool_calls"]]
    assert len(ids) == 4 and len(set(ids)) == 4
    assert all(len(i) == 9 and i.isascii() and i.isalnum() for i in ids), ids
    # the other parsers keep OpenAI-style ids
    found = get_tool_parser("hermes").extract(f"<tool_call>{WEATHER}</tool_call>")
    assert found.calls[0].id.startswith("chatcmpl-tool-")


def test_nan_and_infinity_arguments_are_content():
    """Arguments must be strict JSON (a client's JSON.parse refuses NaN / Infinity): a
    hermes call holding them leaves the reply as content."""
    for bad in ("NaN", "Infinity", "-Infinity"):
        text = f'<tool_call>{{"name": "f", "arguments": {{"a": {bad}}}}}</tool_call>'
        found = get_tool_parser("hermes").extract(text)
        assert found.calls == [] and found.content == text


def test_forced_calls_take_the_server_parsers_ids():
    """tool_choice "required" and a named function on a server whose parser is mistral
    get Mistral's 9-character ids (the chat template refuses others), streamed or not;
    without a parser, upstream's ``chatcmpl-tool-`` ids."""
    from vllm.entrypoints.openai.tool_calls import parse_tool_calls

    mistral = get_tool_parser("mistral")
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice, text in (("required", '[{"name": "get_weather", "parameters": {}}]'),
                         (named, '{"city": "Paris"}')):  # fmt: skip
        req = ChatCompletionRequest(messages=MSGS, tools=TOOLS, tool_choice=choice)
        mode, _ = tool_mode(req, mistral)
        ids = [c.id for c in parse_tool_calls(mode, text)[0]]
        ids += [c.id for c in _stream(mode, [text[:5], text[5:]])[-1]["tool_calls"] if c.id]
        if choice == named:
            ids.append(_stream(mode, [text[:5], text[5:]])[0]["tool_calls"][0].id)
        assert len(ids) >= 2 and all(len(i) == 9 and i.isalnum() for i in ids), ids
        plain, _ = tool_mode(req)
        assert parse_tool_calls(plain, text)[0][0].id.startswith("chatcmpl-tool-")


def test_hermes_content_is_the_text_before_the_first_call():
    """Regression: text between and after the calls was joined into the content; as
    upstream, the content is only the text before the first <tool_call>, streamed or not."""
    p = get_tool_parser("hermes")
    block = f"<tool_call>{WEATHER}</tool_call>"
    text = f"Checking. {block} and {block} Done."
    found = p.extract(text)
    assert len(found.calls) == 2 and found.content == "Checking. "
    assert p.extract(f"{block} Done.").content is None
    deltas = _stream(ToolMode(parser=p), [text[:12], text[12:40], text[40:]])
    assert "".join(d.get("content", "") for d in deltas) == found.content
    assert len(deltas[-1]["tool_calls"]) == 2


def test_required_schema_allows_one_item_without_parallel_calls():
    """parallel_tool_calls false constrains "required" to a one-call array."""
    req = ChatCompletionRequest(messages=MSGS, tools=TOOLS, tool_choice="required")
    mode, guided = tool_mode(req)
    assert not mode.single and "maxItems" not in guided.json
    req = ChatCompletionRequest(messages=MSGS, tools=TOOLS, tool_choice="required",
                                parallel_tool_calls=False)  # fmt: skip
    mode, guided = tool_mode(req)
    assert mode.single and guided.json["maxItems"] == 1 and guided.json["minItems"] == 1


DEEP = "[" * 3000  # nested past json's and Python's parsers' limits (a model looping on "[")
DEEP_REPLIES = {
    "hermes": '<tool_call>{"name": "f", "arguments": {"a": ' + DEEP + "}}</tool_call>",
    "llama3_json": '{"name": "f", "parameters": {"a": ' + DEEP,
    "mistral": '[TOOL_CALLS][{"name": "f", "arguments": {"a": ' + DEEP,
    "pythonic": "[f(a=" + "-" * 100000 + "1)]",
    "deepseek_v3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n"
    '{"a": ' + DEEP + "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "deepseek_v31": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>"
    '{"a": ' + DEEP + "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
}


@pytest.mark.parametrize("name", sorted(DEEP_REPLIES))
def test_a_reply_nested_too_deep_is_content(name):
    """A reply nested deeper than the decoder can follow is content, streamed or not; the
    RecursionError (MemoryError for Python's parser) escaped and the request was a 500."""
    from vllm.entrypoints.openai.tool_calls import parse_tool_calls

    text = DEEP_REPLIES[name]
    mode = ToolMode(parser=get_tool_parser(name))
    assert parse_tool_calls(mode, text) == (None, text)
    deltas = _stream(mode, [text[:20], text[20:]])
    assert "".join(d.get("content", "") for d in deltas) == text
    assert not any("tool_calls" in d for d in deltas)
    req = ChatCompletionRequest(messages=MSGS, tools=TOOLS, tool_choice="required")
    required = '[{"name": "get_weather", "parameters": {"a": ' + DEEP
    assert parse_tool_calls(tool_mode(req)[0], required) == (None, required)


# GLM-4.5's format: the template writes strings bare and other values as JSON
ALARM_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "set_alarm",
            "parameters": {
                "type": "object",
                "properties": {
                    "label": {"type": "string"},
                    "minutes": {"type": "integer"},
                    "loud": {"type": "boolean"},
                    "days": {"type": "array", "items": {"type": "string"}},
                    "note": {"type": ["string", "null"]},
                },
            },
        },
    },
    {"type": "function", "function": {"name": "get_time"}},
]


def _glm_call(name, *pairs, sep="\n"):
    args = "".join(f"<arg_key>{k}</arg_key>{sep}<arg_value>{v}</arg_value>{sep}" for k, v in pairs)
    return f"<tool_call>{name}{sep}{args}</tool_call>"


def test_glm45_blocks_become_calls_and_the_text_before_them_content():
    p = get_tool_parser("glm45")
    assert not p.keeps_special_tokens
    text = "Let me check.\n" + _glm_call("get_weather", ("city", "Paris"), ("unit", "c"))
    text += "\n" + _glm_call("get_time")
    found = p.extract(text)
    assert _calls(found) == [("get_weather", {"city": "Paris", "unit": "c"}), ("get_time", {})]
    assert found.calls[0].function.arguments == '{"city": "Paris", "unit": "c"}'
    assert found.calls[1].function.arguments == "{}"
    assert found.content == "Let me check.\n"
    assert found.calls[0].id.startswith("chatcmpl-tool-")
    only = p.extract(_glm_call("get_time") + "\n")
    assert _calls(only) == [("get_time", {})] and only.content is None
    # the parts with no whitespace between them, or more of it; text after the calls
    tight = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
    loose = ("<tool_call> get_weather \n\n<arg_key> city </arg_key>\n \n<arg_value>Paris"
             "</arg_value>  \n</tool_call> trailing text")  # fmt: skip
    for t in (tight, loose):
        found = p.extract(t)
        assert _calls(found) == [("get_weather", {"city": "Paris"})] and found.content is None


def test_glm45_values_follow_the_tool_schema():
    p = get_tool_parser("glm45")
    text = _glm_call(
        "set_alarm", ("label", "123"), ("minutes", "123"), ("loud", "true"),
        ("days", '["mon", "tue"]'), ("note", "null"), ("extra", "42"),
    )  # fmt: skip
    tools = ChatCompletionRequest(messages=MSGS, tools=ALARM_TOOLS).tools
    [call] = p.extract_for(text, tools).calls
    assert json.loads(call.function.arguments) == {
        "label": "123",  # a string parameter keeps the text
        "minutes": 123,
        "loud": True,
        "days": ["mon", "tue"],
        "note": "null",  # "string" is one of its types: the text
        "extra": 42,  # not in the schema: JSON when it parses
    }
    # without the schema (no tools, a tool the request does not describe) JSON wins
    for found in (p.extract(text), p.extract_for(text, []), p.extract_for(text, tools[1:])):
        untyped = {"label": 123, "minutes": 123, "loud": True, "days": ["mon", "tue"]}
        assert _calls(found)[0][1] == {**untyped, "note": None, "extra": 42}
    # text that is no JSON stays text whatever the schema says; so do NaN and infinities
    odd = _glm_call("set_alarm", ("label", '{"a": 1}'), ("minutes", "soon"),
                    ("loud", "NaN"), ("days", "1e999"), ("x", "Infinity"),
                    ("y", 'say "hi"'), ("z", "{not json"))  # fmt: skip
    assert _calls(p.extract_for(odd, tools))[0][1] == {
        "label": '{"a": 1}', "minutes": "soon", "loud": "NaN", "days": "1e999",
        "x": "Infinity", "y": 'say "hi"', "z": "{not json",
    }  # fmt: skip
    deep = _glm_call("set_alarm", ("days", "[" * 3000))  # past json's nesting limit: text
    assert _calls(p.extract(deep))[0][1] == {"days": "[" * 3000}


@pytest.mark.parametrize(
    "text",
    [
        "The alarm is set.",
        "Sure.\n<tool_call>set_alarm\n<arg_key>minutes</arg_key>\n<arg_value>5",  # cut
        "<tool_call>set_alarm\n<arg_key>minutes</arg_key>\n<arg_value>5</arg_value>\n",  # cut
        _glm_call("get_time") + "<tool_call>set_alarm",  # the second call cut
        "<tool_call>\n<arg_key>minutes</arg_key><arg_value>5</arg_value></tool_call>",  # no name
        "<tool_call>set alarm</tool_call>",  # a name with a space
        "<tool_call>set_alarm\nminutes=5</tool_call>",  # text that is no argument
        "<tool_call>set_alarm<arg_key>minutes</arg_key></tool_call>",  # a key without value
        "<tool_call>set_alarm<arg_key></arg_key><arg_value>5</arg_value></tool_call>",  # no key
        "<tool_call>set_alarm<arg_key>minutes</arg_key><arg_value>5</tool_call>",  # unclosed
        "<tool_call>set_alarm<arg_key>a</arg_key><arg_value>1</arg_value>x</tool_call>",
    ],
)
def test_glm45_cut_or_malformed_replies_are_content(text):
    p = get_tool_parser("glm45")
    found = p.extract(text)
    assert found.calls == [] and found.content == text
    mode = ToolMode(parser=p, tools=ChatCompletionRequest(messages=MSGS, tools=ALARM_TOOLS).tools)
    deltas = _stream(mode, [text[:7], text[7:]])
    assert "".join(d.get("content", "") for d in deltas) == text
    assert not any("tool_calls" in d for d in deltas)


def test_glm45_stream_and_auto_mode_type_values_by_the_requests_tools():
    """tool_mode hands the request's tools to the parser, streamed and not: "123" of the
    string parameter stays a string, that of the integer parameter becomes 123."""
    from vllm.entrypoints.openai.tool_calls import parse_tool_calls

    p = get_tool_parser("glm45")
    text = "Setting it.\n" + _glm_call("set_alarm", ("label", "123"), ("minutes", "123"))
    mode, _ = tool_mode(_req(tools=ALARM_TOOLS), p)
    want = [("set_alarm", {"label": "123", "minutes": 123})]
    calls, content = parse_tool_calls(mode, text)
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == want
    assert content == "Setting it.\n"
    pieces = [text[:5], text[5:14], text[14:30], text[30:]]
    deltas = _stream(mode, pieces)
    assert "".join(d.get("content", "") for d in deltas) == "Setting it.\n"
    calls = deltas[-1]["tool_calls"]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == want


# DeepSeek's formats: the markers are special tokens with full-width bars and U+2581
DS_V3_CALLS = (
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
    '```json\n{"city": "Paris", "days": [1, 2]}\n```<｜tool▁call▁end｜>\n'
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜>"
    "<｜tool▁calls▁end｜>"
)
DS_V31_CALLS = (
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
    '{"city": "Paris", "days": [1, 2]}<｜tool▁call▁end｜>'
    "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
)
DS_CALLS = {"deepseek_v3": DS_V3_CALLS, "deepseek_v31": DS_V31_CALLS}


@pytest.mark.parametrize("name", sorted(DS_CALLS))
def test_deepseek_calls_and_the_text_before_them(name):
    p = get_tool_parser(name)
    assert p.keeps_special_tokens  # the markers are special tokens
    calls = DS_CALLS[name]
    found = p.extract("Let me check.\n" + calls + "\nafter the calls")
    assert _calls(found) == [("get_weather", {"city": "Paris", "days": [1, 2]}),
                             ("get_time", {})]  # fmt: skip
    assert found.calls[0].function.arguments == '{"city": "Paris", "days": [1, 2]}'
    assert found.calls[1].function.arguments == "{}"
    assert found.content == "Let me check.\n"
    assert found.calls[0].id.startswith("chatcmpl-tool-")
    # one call, nothing before it; whitespace between the markers
    first = calls[: calls.index("<｜tool▁call▁end｜>") + len("<｜tool▁call▁end｜>")]
    found = p.extract(" \n" + first.replace("><", ">\n <") + "\n<｜tool▁calls▁end｜>")
    assert _calls(found) == [("get_weather", {"city": "Paris", "days": [1, 2]})]
    assert found.content is None


@pytest.mark.parametrize("name", sorted(DS_CALLS))
def test_deepseek_cut_or_malformed_replies_are_content(name):
    p = get_tool_parser(name)
    calls = DS_CALLS[name]
    other = DS_CALLS["deepseek_v31" if name == "deepseek_v3" else "deepseek_v3"]
    bad = [
        "The weather is fine.",
        "Sure." + calls[: -len("<｜tool▁calls▁end｜>")],  # cut before the frame's end
        "Sure." + calls[: calls.index("<｜tool▁call▁end｜>")],  # cut inside the first call
        "<｜tool▁calls▁begin｜><｜tool▁calls▁end｜>",  # a frame with no call
        calls.replace("<｜tool▁call▁end｜>", "<｜tool▁call▁end｜> and ", 1),  # other text
        calls.replace("get_weather", "get weather"),  # a name with a space
        calls.replace('{"city": "Paris", "days": [1, 2]}', '["Paris"]'),  # not an object
        calls.replace('{"city": "Paris", "days": [1, 2]}', '{"city": "Par'),  # no JSON
        calls.replace('{"city": "Paris", "days": [1, 2]}', '{"a": NaN}'),  # not strict JSON
        other,  # the other DeepSeek format
    ]
    if name == "deepseek_v3":
        bad += [
            calls.replace("```json\n{}\n```", "{}"),  # no fence
            calls.replace("function<｜tool▁sep｜>get_time", "code<｜tool▁sep｜>get_time"),
        ]
    for text in bad:
        assert text != calls
        found = p.extract(text)
        assert found.calls == [] and found.content == text, text
        deltas = _stream(ToolMode(parser=p), [text[:6], text[6:]])
        assert "".join(d.get("content", "") for d in deltas) == text
        assert not any("tool_calls" in d for d in deltas)


def test_deepseek_markers_are_the_tokenizers():
    """The markers as DeepSeek's tokenizer spells them: full-width bars, U+2581 spaces."""
    from vllm.entrypoints.openai.tool_parsers import deepseek

    assert deepseek.CALLS_BEGIN == "<\uff5ctool\u2581calls\u2581begin\uff5c>"
    assert deepseek.CALL_END == "<\uff5ctool\u2581call\u2581end\uff5c>"
    assert deepseek.SEP == "<\uff5ctool\u2581sep\uff5c>"


PREFIX_REPLIES = [  # parser, a reply with content before its calls, the calls' marker
    ("hermes", f"Let me check.\n<tool_call>{WEATHER}</tool_call>", "<tool_call>"),
    ("mistral", 'Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "[TOOL_CALLS]"),
    ("glm45", "Let me <b>check</b>.\n" + _glm_call("get_weather", ("city", "Paris")),
     "<tool_call>"),
    ("deepseek_v3", "Let me <｜check｜>.\n" + DS_V3_CALLS, "<｜tool▁calls▁begin｜>"),
    ("deepseek_v31", "Let me <｜check｜>.\n" + DS_V31_CALLS, "<｜tool▁calls▁begin｜>"),
]  # fmt: skip


@pytest.mark.parametrize("name,text,marker", PREFIX_REPLIES, ids=[r[0] for r in PREFIX_REPLIES])
def test_content_prefix_grows_and_stops_before_the_calls(name, text, marker):
    """On every prefix of a reply, content_prefix never shrinks and never reaches the
    marker that starts the calls; on the whole reply it is the content extract finds."""
    p = get_tool_parser(name)
    at, last = text.index(marker), 0
    for i in range(len(text) + 1):
        n = p.content_prefix(text[:i])
        assert last <= n <= min(i, at), (text[:i], n)
        last = n
    assert text[:last] == p.extract(text).content
