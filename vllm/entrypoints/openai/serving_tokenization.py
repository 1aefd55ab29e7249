"""``POST /tokenize`` and ``POST /detokenize``, upstream vLLM's tokenizer endpoints.

``/tokenize`` takes a ``prompt`` (text, tokenized as ``/v1/completions`` does, special
tokens added unless ``add_special_tokens`` is false) or chat ``messages`` (rendered with
the chat template as ``/v1/chat/completions`` does, with its ``tools``,
``chat_template_kwargs`` and ``continue_final_message``; the tokenizer's special tokens
only with ``add_special_tokens`` true) and answers
``{"count", "max_model_len", "tokens", "token_strs"}`` (``token_strs``, each id's token
string, only with ``return_token_strs``). ``/detokenize`` takes ``tokens`` and answers
``{"prompt"}``. Both run on the tokenizer thread, check ``model`` like the other
endpoints, and answer 400 for a bad body (both or neither of prompt and messages, ids
outside the vocabulary, no tokenizer).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from vllm.entrypoints.openai.api_errors import APIError
from vllm.entrypoints.openai.protocol import (
    ChatCompletionToolsParam,
    ChatMessage,
    OpenAIBaseModel,
    OpenAIRequest,
)
from vllm.entrypoints.openai.serving_chat import OpenAIServingChat


class TokenizeRequest(OpenAIRequest):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    # the tokenizer's special tokens: None -> added to a prompt, not to rendered messages
    # (whose template writes them), as upstream's two tokenize requests default
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ChatCompletionToolsParam] | None = None
    return_token_strs: bool | None = False


class TokenizeResponse(OpenAIBaseModel):
    count: int
    max_model_len: int
    tokens: list[int] = Field(default_factory=list)
    # with return_token_strs: each id's token string (tokenizer.convert_ids_to_tokens)
    token_strs: list[str] | None = None


class DetokenizeRequest(OpenAIRequest):
    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(OpenAIBaseModel):
    prompt: str


class OpenAIServingTokenization:
    """The two endpoints, sharing the chat handler's tokenizer thread, checks and
    template rendering.

    Args:
        chat: the server's chat handler.
    """

    def __init__(self, chat: OpenAIServingChat):
        self.chat = chat

    def _tokenizer(self):
        if self.chat.tokenizer is None:
            raise APIError("tokenization needs a tokenizer (skip_tokenizer_init is set).", 400)
        return self.chat.tokenizer

    async def tokenize(self, req: TokenizeRequest) -> TokenizeResponse:
        """Token ids of ``req.prompt`` or of the rendered ``req.messages``.

        Raises:
            APIError: 404 for another model's name; 400 for both or neither of prompt and
                messages, text that is not valid Unicode, or a chat template problem (a
                text longer than the context is tokenized: ``count`` above
                ``max_model_len`` tells the client so).
        """
        chat = self.chat
        chat.check_model(req.model)
        tok = self._tokenizer()
        if (req.prompt is None) == (req.messages is None):
            raise APIError("give exactly one of prompt and messages.", 400, "prompt")
        # no context-length refusal: counting a text's tokens is what /tokenize is for,
        # also (above all) for texts too long to serve, as upstream
        if req.messages is not None:
            ids = await chat.message_ids(
                req, bool(req.add_special_tokens), bounded=False, tools=req.tools
            )
        else:
            add = req.add_special_tokens is not False
            ids = await chat.encode(req.prompt, "prompt", bounded=False, add_special_tokens=add)
        strs = tok.convert_ids_to_tokens(ids) if req.return_token_strs else None
        return TokenizeResponse(
            count=len(ids), max_model_len=chat.max_model_len, tokens=ids, token_strs=strs
        )

    async def detokenize(self, req: DetokenizeRequest) -> DetokenizeResponse:
        """The text of ``req.tokens`` (special tokens kept, as upstream).

        Raises:
            APIError: 404 for another model's name; 400 for an id outside the vocabulary.
        """
        chat = self.chat
        chat.check_model(req.model)
        tok = self._tokenizer()
        vocab = chat.engine.model_config.vocab_size
        bad = [t for t in req.tokens if not 0 <= t < vocab]
        if bad:
            raise APIError(
                f"token id {bad[0]} is out of vocabulary (valid ids: 0..{vocab - 1}).",
                400,
                "tokens",
            )
        text = await chat.off_loop(lambda: tok.decode(req.tokens))
        return DetokenizeResponse(prompt=text)
