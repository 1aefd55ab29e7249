"""What a chat template sees: messages keep name, tool_calls (arguments decoded from JSON
text to objects) and tool_call_id; tools and chat_template_kwargs are variables;
continue_final_message ends the prompt inside the last message; contradicting options and
undecodable arguments are refused naming the field."""

import pytest

from vllm.entrypoints.chat_utils import (
    ChatInputError,
    check_chat_options,
    detect_content_format,
    message_text,
    render_chat,
    resolve_content_format,
    template_messages,
)

TEMPLATE = (
    "{% if tools %}TOOLS={{tools|length}};{% endif %}{% for m in messages %}"
    "<{{m['role']}}|{{m['content']}}|calls={{m.get('tool_calls')}}|id={{m.get('tool_call_id')}}"
    "|name={{m.get('name')}}>{% endfor %}{% if foo is defined %}FOO={{foo}}{% endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather"}}
MESSAGES = [
    {"role": "user", "content": "Weather in Paris?", "name": "bob"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {**CALL, "function": {**CALL["function"], "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama_dir)


def test_messages_keep_tool_fields_with_arguments_as_objects():
    conv = template_messages(MESSAGES)
    assert conv == [
        {"role": "user", "content": "Weather in Paris?", "name": "bob"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {**CALL, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]
    assert MESSAGES[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'


def test_tools_and_kwargs_reach_the_template(tokenizer):
    text = render_chat(
        tokenizer, template_messages(MESSAGES), TEMPLATE, False, tools=TOOLS,
        chat_template_kwargs={"foo": "bar"},
    )  # fmt: skip
    assert text == (
        "TOOLS=1;<user|Weather in Paris?|calls=None|id=None|name=bob>"
        "<assistant||calls=[{'id': 'call_1', 'type': 'function', 'function': "
        "{'name': 'get_weather', 'arguments': {'city': 'Paris'}}}]|id=None|name=None>"
        "<tool|sunny|calls=None|id=call_1|name=None>FOO=bar"
    )


def test_continue_final_message_ends_inside_it(tokenizer):
    conv = template_messages(
        [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "1, 2,"}]
    )
    closed = render_chat(tokenizer, conv, None, False)
    assert closed.endswith("<|im_start|>assistant\n1, 2,<|im_end|>\n")
    cont = render_chat(tokenizer, conv, None, False, continue_final_message=True)
    assert cont == closed[: -len("<|im_end|>\n")]


@pytest.mark.parametrize("args", ["", "  "])
def test_empty_arguments_text_is_an_empty_object(args):
    """Regression: a replayed zero-argument call (``"arguments": ""``) was a 400 saying
    the arguments are not JSON; it reaches the template as ``{}``."""
    msgs = [{"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f",
            "arguments": args}}]}]  # fmt: skip
    [msg] = template_messages(msgs)
    assert msg["tool_calls"] == [{**CALL, "function": {"name": "f", "arguments": {}}}]


def test_bad_options_and_arguments_name_the_field():
    with pytest.raises(ChatInputError) as exc:
        check_chat_options(True, True, None)
    assert exc.value.param == "continue_final_message"
    assert "add_generation_prompt=false" in str(exc.value)
    with pytest.raises(ChatInputError) as exc:
        check_chat_options(True, False, {"tools": [], "foo": 1})
    assert exc.value.param == "chat_template_kwargs" and "['tools']" in str(exc.value)
    check_chat_options(False, True, {"foo": 1})
    bad = [
        {
            "role": "assistant",
            "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "{x"}}],
        }
    ]
    with pytest.raises(ChatInputError) as exc:
        template_messages(bad)
    assert exc.value.param == "messages.0.tool_calls.0.function.arguments"
    assert "'{x'" in str(exc.value)
    with pytest.raises(ChatInputError) as exc:
        template_messages([{"role": "user", "content": [{"type": "image_url"}]}])
    assert exc.value.param == "messages.0.content.0.type"


def test_text_parts_joined_by_newlines():
    """A list of text parts reaches the template as one string, the parts joined by "\\n"
    (upstream vLLM's rendering), never glued together."""
    parts = [{"type": "text", "text": "Say"}, {"type": "text", "text": "hello"}]
    conv = template_messages([{"role": "user", "content": parts}])
    assert conv == [{"role": "user", "content": "Say\nhello"}]
    one = template_messages([{"role": "user", "content": [{"type": "text", "text": "Hi"}]}])
    assert one[0]["content"] == "Hi"


# Renders a string content as S:<text>, a list of parts as P:<text> per part.
EITHER = (
    "{% for m in messages %}<{{ m['role'] }}>{% if m['content'] is string %}"
    "S:{{ m['content'] }}{% else %}{% for p in m['content'] %}P:{{ p['text'] }}"
    "{% endfor %}{% endif %}{% endfor %}"
)
PLAIN = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
PARTS = [{"type": "text", "text": "Say"}, {"type": "text", "text": "hello"}]


@pytest.mark.parametrize(
    "fmt, text",
    [("string", "<user>S:Say\nhello<assistant>S:ok<tool>S:"),
     ("openai", "<user>P:SayP:hello<assistant>P:ok<tool>")],
)  # fmt: skip
def test_content_format_string_or_openai(tokenizer, fmt, text):
    """``string`` hands the template one string per message, ``openai`` a list of text
    parts (a string content one part, no content none): the rendered prompt and its
    token ids follow."""
    messages = [{"role": "user", "content": PARTS}, {"role": "assistant", "content": "ok"},
                {"role": "tool", "content": None}]  # fmt: skip
    conv = template_messages(messages, fmt)
    if fmt == "openai":
        assert conv[0]["content"] == PARTS and conv[2]["content"] == []
        assert [message_text(m) for m in conv] == ["Say\nhello", "ok", ""]
    rendered = render_chat(tokenizer, conv, EITHER, False)
    assert rendered == text
    assert tokenizer.encode(rendered, add_special_tokens=False) == tokenizer.encode(
        text, add_special_tokens=False
    )


@pytest.mark.parametrize(
    "template, want",
    [
        (EITHER, "openai"),
        (PLAIN, "string"),
        ("{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}",
         "openai"),
        # aliases of the list, a message and its content
        ("{% set rest = messages[1:] %}{% for m in rest %}{% set c = m['content'] %}"
         "{% for p in c %}{{ p['text'] }}{% endfor %}{% endfor %}", "openai"),
        ("{% for p in messages[0]['content'] %}{{ p['text'] }}{% endfor %}", "openai"),
        # Llama 3.1's system-message branch reads ['text'] but loops over no content
        ("{% if messages[0]['content'] is string %}{% set s = messages[0]['content'] %}"
         "{% else %}{% set s = messages[0]['content'][0]['text'] %}{% endif %}{{ s }}"
         "{% for m in messages %}{{ m['content'] | trim }}{% endfor %}", "string"),
        ("{% for m in messages %}{% for x in m['tool_calls'] %}{% endfor %}{% endfor %}",
         "string"),
        ("{% for %}", "string"),  # does not parse: rendering reports it
    ],
)  # fmt: skip
def test_auto_content_format_detection(template, want):
    assert detect_content_format(template) == want
    assert resolve_content_format("auto", template) == want
    assert resolve_content_format("string", EITHER) == "string"


def test_auto_content_format_of_the_tokenizers_template(tokenizer):
    """SmolLM2's own template prints ``message['content']``: string."""
    assert resolve_content_format("auto", None, tokenizer) == "string"
    with pytest.raises(ValueError, match="content format 'text' is not supported"):
        resolve_content_format("text", None, tokenizer)


def test_explicit_content_format_mismatch_names_the_format(tokenizer):
    """A template joining string content (``'>' + content``) under an explicit
    ``openai`` format: a ChatInputError naming chat_template_content_format and the value
    to try ('string', which renders). Guards: the bare Jinja TypeError."""
    concat = "{% for m in messages %}{{ '<' + m['role'] + '>' + m['content'] }}{% endfor %}"
    messages = [{"role": "user", "content": PARTS}]
    with pytest.raises(ChatInputError) as e:
        render_chat(tokenizer, template_messages(messages, "openai"), concat, False,
                    content_format_option="openai")  # fmt: skip
    assert e.value.param == "chat_template_content_format"
    assert "chat_template_content_format='openai'" in str(e.value)
    assert 'can only concatenate str (not "list") to str' in str(e.value)
    assert "try chat_template_content_format='string'" in str(e.value)
    assert isinstance(e.value, ValueError)
    as_string = template_messages(messages, "string")
    assert render_chat(tokenizer, as_string, concat, False, content_format_option="string") == (
        "<user>Say\nhello"
    )
    assert resolve_content_format("auto", concat) == "string"  # auto picks the right one
    with pytest.raises(TypeError):  # auto (no explicit choice): the template's own error
        render_chat(tokenizer, template_messages(messages, "openai"), concat, False)
