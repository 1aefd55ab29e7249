"""LLM.chat renders each conversation with the model's chat template (generation prompt
added) and generates exactly as generate() on those token ids."""

import os

import pytest

from vllm import LLM, SamplingParams

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.mark.forked
def test_chat_batch_equals_template_plus_generate(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, device="cpu", max_model_len=256)
    tok = llm.get_tokenizer()
    assert tok.chat_template
    convs = [
        [{"role": "user", "content": "What is the capital of France?"}],
        [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Count to 3 😀"},
        ],
    ]
    params = SamplingParams(temperature=0.0, max_tokens=10)
    chat = llm.chat(convs, params, use_tqdm=False)
    expected_ids, expected_texts = [], []
    for conv in convs:
        ids = tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        text = tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
        assert text.endswith("<|im_start|>assistant\n")
        assert ids == tok.encode(text)
        expected_ids.append(ids)
        expected_texts.append(text)
    ref = llm.generate([{"prompt_token_ids": i} for i in expected_ids], params, use_tqdm=False)
    assert [list(o.prompt_token_ids) for o in chat] == expected_ids
    assert [o.prompt for o in chat] == expected_texts  # the rendered template, as upstream
    for c, r in zip(chat, ref):
        assert list(c.outputs[0].token_ids) == list(r.outputs[0].token_ids)
        assert c.outputs[0].text == r.outputs[0].text
    # a single conversation (not a list of them) gives one output
    single = llm.chat(convs[0], params, use_tqdm=False)
    assert len(single) == 1 and single[0].outputs[0].token_ids == chat[0].outputs[0].token_ids
    # upstream's chat_template_content_format: the template gets a list of text parts
    either = ("{% for m in messages %}{% if m['content'] is string %}S:{{ m['content'] }}"
              "{% else %}{% for p in m['content'] %}P:{{ p['text'] }}{% endfor %}{% endif %}"
              "{% endfor %}")  # fmt: skip
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"},
                                          {"type": "text", "text": "b"}]}]  # fmt: skip
    for fmt, text in (("openai", "P:aP:b"), ("auto", "P:aP:b"), ("string", "S:a\nb")):
        [out] = llm.chat(parts, SamplingParams(max_tokens=1), use_tqdm=False,
                         chat_template=either, chat_template_content_format=fmt)  # fmt: skip
        assert out.prompt == text
        assert list(out.prompt_token_ids) == tok.encode(text, add_special_tokens=False)
    # a template for string content under an explicit "openai": a ValueError that says
    # which format to try, not Jinja's bare TypeError
    concat = "{% for m in messages %}{{ m['role'] + ':' + m['content'] }}{% endfor %}"
    with pytest.raises(ValueError, match=r"try chat_template_content_format='string'"):
        llm.chat(parts, SamplingParams(max_tokens=1), use_tqdm=False, chat_template=concat,
                 chat_template_content_format="openai")  # fmt: skip
    [out] = llm.chat(parts, SamplingParams(max_tokens=1), use_tqdm=False, chat_template=concat,
                     chat_template_content_format="string")  # fmt: skip
    assert out.prompt == "user:a\nb"


@pytest.mark.forked
def test_chat_takes_tools_template_kwargs_and_continue_final_message(tiny_llama_dir):
    """LLM.chat renders as the server does: tools, chat_template_kwargs and tool-call
    messages reach the template, and continue_final_message ends the prompt inside the
    last message."""
    from vllm.entrypoints.chat_utils import render_chat, template_messages

    llm = LLM(tiny_llama_dir, device="cpu", max_model_len=256)
    tok = llm.get_tokenizer()
    template = (
        "{{ tools[0]['function']['name'] }}|{{ foo }}|{% for m in messages %}"
        "{{ m['role'] }}:{{ m['content'] }}{{ m.get('tool_call_id', '') }};{% endfor %}"
    )
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    conv = [
        {"role": "user", "content": "Hi"},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]
    params = SamplingParams(temperature=0.0, max_tokens=2)
    [out] = llm.chat(
        conv, params, use_tqdm=False, chat_template=template, tools=tools,
        chat_template_kwargs={"foo": "bar"}, add_generation_prompt=False,
    )  # fmt: skip
    text = "get_weather|bar|user:Hi;tool:sunnycall_1;"
    assert list(out.prompt_token_ids) == tok.encode(text, add_special_tokens=False)

    conv = [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "1, 2,"}]
    [out] = llm.chat(
        conv, params, use_tqdm=False, add_generation_prompt=False, continue_final_message=True
    )
    text = render_chat(tok, template_messages(conv), None, False, continue_final_message=True)
    assert text.endswith("<|im_start|>assistant\n1, 2,")
    assert list(out.prompt_token_ids) == tok.encode(text, add_special_tokens=False)
    with pytest.raises(ValueError, match="add_generation_prompt=false"):
        llm.chat(conv, params, continue_final_message=True)


@pytest.mark.forked
def test_chat_positional_arguments_in_upstream_order(tiny_llama_dir):
    """``chat(messages, sampling_params, use_tqdm, lora_request, chat_template,
    chat_template_content_format, add_generation_prompt, ...)``, upstream's order. Guards:
    the fourth parameter was add_generation_prompt, so an adapter passed fourth was taken
    for it (silently, no adapter) and the later positions were shifted."""
    llm = LLM(tiny_llama_dir, device="cpu", max_model_len=128)
    template = "{{ messages[0]['content'] }}|gen={{ add_generation_prompt }}"
    conv = [{"role": "user", "content": "Hi"}]
    params = SamplingParams(max_tokens=1)
    [out] = llm.chat(conv, params, False, None, template, "string", False)
    assert out.prompt == "Hi|gen=False"
    [out] = llm.chat(conv, params, False, None, template, "string")
    assert out.prompt == "Hi|gen=True"
