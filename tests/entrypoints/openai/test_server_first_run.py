"""`vllm serve` as a new user meets it, on a tiny Llama checkpoint without a chat template:
the default served names (the path given, then the short one), the 404 that lists them,
the start-up summary in the server log, --chat-template (inline Jinja) rendering chat
prompts, and the request log showing that rendered text cut to --max-log-len (not token
ids). A checkpoint without a template and no --chat-template answers chat with a clear
400."""

import asyncio
import os
import shutil

import httpx
import pytest

from tests.entrypoints.test_first_run import summary_fields
from tests.utils import RemoteOpenAIServer

# One xdist worker runs this module (.ci/run: --dist loadgroup), so its module-scoped
# server starts once, not once per worker.
pytestmark = pytest.mark.xdist_group("test_server_first_run")

TEMPLATE = (
    "{% for m in messages %}<<{{ m['role'] }}>>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<<assistant>>{% endif %}"
)
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is the capital of France?"},
]
RENDERED = "<<system>>Be brief.\n<<user>>What is the capital of France?\n<<assistant>>"
MAX_LOG_LEN = 30
NAME = "llama-notemplate"


@pytest.fixture(scope="module")
def no_template_dir(tiny_llama_dir, tmp_path_factory):
    """A copy of the tiny Llama checkpoint without chat_template.jinja (weights linked)."""
    out = tmp_path_factory.mktemp("ckpt") / NAME
    out.mkdir()
    for name in os.listdir(tiny_llama_dir):
        src = os.path.join(tiny_llama_dir, name)
        if name == "chat_template.jinja":
            continue
        if name.endswith(".safetensors"):
            os.symlink(src, out / name)
        else:
            shutil.copy(src, out / name)
    return str(out)


@pytest.fixture(scope="module")
def tokenizer(no_template_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(no_template_dir)
    assert not tok.chat_template
    return tok


@pytest.fixture(scope="module")
def server(no_template_dir):
    args = ["--device", "cpu", "--max-model-len", "128", "--chat-template", TEMPLATE]
    args += ["--max-log-len", str(MAX_LOG_LEN)]
    srv = RemoteOpenAIServer(no_template_dir, args)
    try:
        yield srv
    finally:
        srv.stop()


def test_default_served_name_and_the_404_lists_it(server, no_template_dir):
    """The path given (upstream's served name) first, then the short name."""
    models = httpx.get(server.url_for("v1", "models"), timeout=30).json()
    assert [m["id"] for m in models["data"]] == [no_template_dir, NAME]
    body = {"model": "smollm2", "prompt": "Hi", "max_tokens": 1}
    r = httpx.post(server.url_for("v1", "completions"), json=body, timeout=60)
    assert r.status_code == 404
    assert r.json()["error"]["message"] == (
        f"The model `smollm2` does not exist. Available models: `{no_template_dir}`, `{NAME}`."
    )
    r = httpx.post(server.url_for("v1", "completions"), json={**body, "model": ""}, timeout=60)
    assert r.status_code == 200 and r.json()["model"] == no_template_dir  # "": the default


def test_startup_summary_in_the_server_log(server):
    f = summary_fields(server.read_log())
    assert f["device"].startswith("cpu (") and f["dtype"] == "float32"
    assert f["attention"] == "TORCH_SDPA" and int(f["blocks"]) > 0
    assert float(f["kv_gib"]) > 0
    assert f["graphs"] == "eager (CUDA graphs need a CUDA device)"
    assert f["parallel"] == "pp 1 x tp 1 (uni executor, 1 virtual engine)"


def test_chat_template_flag_renders_the_prompt_and_the_log_shows_text(server, tokenizer):
    body = {"model": NAME, "messages": MESSAGES, "max_tokens": 2, "temperature": 0.0}
    r = httpx.post(server.url_for("v1", "chat", "completions"), json=body, timeout=120)
    assert r.status_code == 200, r.text
    data = r.json()
    ids = tokenizer.encode(RENDERED, add_special_tokens=False)
    assert data["usage"]["prompt_tokens"] == len(ids)
    log = server.read_log()
    line = next(x for x in log.splitlines() if f"Received request {data['id']}" in x)
    assert f"prompt: {RENDERED[:MAX_LOG_LEN]!r}, params:" in line
    assert "prompt_token_ids" not in line and str(ids[:3])[1:-1] not in line


def _chat_handler(tokenizer, template, **kw):
    from vllm.entrypoints.openai.serving_chat import OpenAIServingChat

    class _Engine:
        max_model_len = 128
        default_sampling = {}

    engine = _Engine()
    engine.tokenizer = tokenizer
    return OpenAIServingChat(engine, [NAME], chat_template=template, **kw)


def test_chat_without_any_template_is_a_400(tokenizer):
    from vllm.entrypoints.openai.api_errors import APIError
    from vllm.entrypoints.openai.protocol import ChatCompletionRequest

    req = ChatCompletionRequest(messages=MESSAGES)
    with pytest.raises(APIError) as exc:
        asyncio.run(_chat_handler(tokenizer, None)._prompt(req))
    assert exc.value.code == 400
    assert exc.value.message.startswith(
        f"The model `{NAME}` has no chat template, so chat requests cannot be served: start "
        "the server with --chat-template"
    )
    # The request's own template, then the server's, render the conversation.
    text, ids, _ = asyncio.run(_chat_handler(tokenizer, TEMPLATE)._prompt(req))
    assert (text, ids) == (RENDERED, tokenizer.encode(RENDERED, add_special_tokens=False))
    req = ChatCompletionRequest(messages=MESSAGES, chat_template="{{ messages[1]['content'] }}")
    trusting = _chat_handler(tokenizer, TEMPLATE, trust_request_chat_template=True)
    text, _, _ = asyncio.run(trusting._prompt(req))
    assert text == "What is the capital of France?"


def test_request_templates_need_trust_request_chat_template(tokenizer):
    """As upstream: a template sent with the request (chat_template, or chat_template in
    chat_template_kwargs) is a 400 naming the flag unless the server trusts them; with
    --trust-request-chat-template it renders the chat (the server's template otherwise)."""
    from vllm.entrypoints.openai.api_errors import APIError
    from vllm.entrypoints.openai.protocol import ChatCompletionRequest

    own = "{{ messages[1]['content'] }}"
    cases = [({"chat_template": own}, "chat_template", "chat_template"),
             ({"chat_template_kwargs": {"chat_template": own}}, "chat_template_kwargs",
              "chat_template_kwargs.chat_template")]  # fmt: skip
    for fields, param, named in cases:
        req = ChatCompletionRequest(messages=MESSAGES, **fields)
        with pytest.raises(APIError) as exc:
            asyncio.run(_chat_handler(tokenizer, TEMPLATE)._prompt(req))
        assert (exc.value.code, exc.value.param) == (400, param)
        assert exc.value.message.startswith(f"the request sets {named}, but this server")
        assert "--trust-request-chat-template" in exc.value.message
    req = ChatCompletionRequest(messages=MESSAGES, chat_template=own)
    trusting = _chat_handler(tokenizer, TEMPLATE, trust_request_chat_template=True)
    assert asyncio.run(trusting._prompt(req))[0] == "What is the capital of France?"
    plain = ChatCompletionRequest(messages=MESSAGES, chat_template_kwargs={"x": 1})
    assert asyncio.run(_chat_handler(tokenizer, TEMPLATE)._prompt(plain))[0] == RENDERED
