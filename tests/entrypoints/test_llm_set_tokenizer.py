"""``LLM.set_tokenizer`` (upstream's): from the next call on, prompts are encoded, outputs
decoded, chats rendered and sequences stopped at EOS with the new tokenizer (the method
used to be missing: AttributeError)."""

import os

import pytest
from transformers import AutoTokenizer

from vllm import LLM, SamplingParams

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.mark.forked
def test_set_tokenizer_changes_eos_and_chat_template(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, device="cpu", max_model_len=128)
    params = SamplingParams(max_tokens=6, temperature=0.0)
    before = llm.generate("Hello", params, use_tqdm=False)[0].outputs[0]
    assert before.finish_reason == "length" and len(set(before.token_ids)) >= 4

    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    tok.eos_token = tok.convert_ids_to_tokens(before.token_ids[2])  # greedy's third token
    tok.chat_template = "CHAT:{{ messages[0]['content'] }}"
    llm.set_tokenizer(tok)
    assert llm.get_tokenizer() is tok

    after = llm.generate("Hello", params, use_tqdm=False)[0].outputs[0]
    assert after.token_ids == before.token_ids[:3]  # stopped at the new EOS
    assert after.finish_reason == "stop"
    assert after.text == tok.decode(before.token_ids[:2])
    chat = llm.chat([{"role": "user", "content": "Hi"}], params, use_tqdm=False)[0]
    assert chat.prompt == "CHAT:Hi" and chat.prompt_token_ids == tok.encode("CHAT:Hi")


@pytest.mark.forked
def test_set_tokenizer_refused_while_requests_run(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, device="cpu", max_model_len=128)
    llm.llm_engine.add_request("r", "Hello", SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match=r"set_tokenizer\(\) while 1 requests run"):
        llm.set_tokenizer(llm.get_tokenizer())
    llm.llm_engine.abort_request("r")
    llm.set_tokenizer(llm.get_tokenizer())
