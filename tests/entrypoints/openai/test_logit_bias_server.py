"""`vllm serve` passes logit_bias (JSON keys are strings of token ids) and
allowed_token_ids through /v1/completions and /v1/chat/completions; values beyond
[-100, 100] are clamped, bad keys and values that are no numbers are answered with HTTP
400 naming them. One tiny-model server, started and stopped in a
forked child."""

import httpx
import pytest

from tests.utils import RemoteOpenAIServer

FORCED = 4242
N = 6


@pytest.mark.forked
def test_logit_bias_through_the_server(tiny_llama_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    forced_text = tok.decode([FORCED] * N)
    args = ["--device", "cpu", "--served-model-name", "tiny", "--max-model-len", "256"]
    with RemoteOpenAIServer(tiny_llama_dir, args, env={"VLLM_CPU_KVCACHE_SPACE": "0.05"}) as srv:
        client = srv.get_client()
        common = dict(model="tiny", max_tokens=N, temperature=0)
        base = client.completions.create(prompt="Hello world", **common)
        assert base.choices[0].text != forced_text
        r = client.completions.create(
            prompt="Hello world", logit_bias={str(FORCED): 100}, logprobs=1, **common
        )
        assert r.choices[0].text == forced_text
        assert r.usage.completion_tokens == N
        chat = client.chat.completions.create(
            messages=[{"role": "user", "content": "Hi"}],
            logit_bias={str(FORCED): 100},
            extra_body={"ignore_eos": True},
            **common,
        )
        assert chat.choices[0].message.content == forced_text
        # vLLM's allowed_token_ids (an extra field)
        r = client.completions.create(
            prompt="Hello world", extra_body={"allowed_token_ids": [FORCED]}, **common
        )
        assert r.choices[0].text == forced_text

        url = srv.url_for("v1", "completions")
        body = dict(model="tiny", prompt="Hello world", max_tokens=2)
        # a value beyond [-100, 100] is clamped to it, as upstream: 1e9 forces like 100
        resp = httpx.post(url, json={**body, "logit_bias": {str(FORCED): 1e9}}, timeout=60)
        assert resp.status_code == 200, resp.text
        assert resp.json()["choices"][0]["text"] == tok.decode([FORCED] * 2)
        for bias, named in (
            ({"abc": 1}, "'abc'"),
            ({str(tok.vocab_size + 7): 1}, str(tok.vocab_size + 7)),
        ):
            resp = httpx.post(url, json={**body, "logit_bias": bias}, timeout=60)
            assert resp.status_code == 400, resp.text
            err = resp.json()["error"]
            assert "logit_bias" in err["message"] and named in err["message"], err
        resp = httpx.post(url, json={**body, "logit_bias": {"5": "lots"}}, timeout=60)
        assert resp.status_code == 400 and "logit_bias" in resp.text, resp.text
        # the server is still healthy and serving
        assert httpx.get(srv.url_for("health"), timeout=10).status_code == 200
        again = client.completions.create(prompt="Hello world", **common)
        assert again.choices[0].text == base.choices[0].text
