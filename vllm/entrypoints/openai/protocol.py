"""Pydantic models of the OpenAI-compatible API (the fields this server implements).

Unknown fields are accepted and ignored (clients send many optional ones); as upstream,
one warning per request names them. vLLM's extra sampling fields (top_k, min_p,
repetition_penalty, min_tokens, ignore_eos, ...) are accepted as upstream does, and so are
its structured-output fields (``structured_outputs``, and the older ``response_format``,
``guided_json``, ``guided_regex``, ``guided_choice``, ``guided_grammar``,
``guided_decoding_backend``) and chat ``tools`` / ``tool_choice``.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from contextvars import ContextVar
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

logger = logging.getLogger(__name__)

# The ignored keys found so far while one top-level model validates (nested models add
# theirs), so that a request logs one warning; None outside a validation.
_ignored_keys: ContextVar[set[str] | None] = ContextVar("_ignored_keys", default=None)


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def _is_none(value: Any) -> bool:
    return value is None


def omitted_when_none() -> Any:
    """A response field that defaults to None and is left out of the JSON while None
    (vLLM's additions to OpenAI's objects, such as ``token_ids``, appear only when asked)."""
    return Field(default=None, exclude_if=_is_none)


class OpenAIBaseModel(BaseModel):
    """Unknown keys are dropped (clients send many optional ones). Responses and stream
    chunks use this base alone: no Python validator, so building one stays cheap."""

    model_config = ConfigDict(extra="ignore")


class RequestFields(OpenAIBaseModel):
    """The base of an object inside a request body (``structured_outputs``, ``tools``,
    ...): its ignored keys join its request's warning (:class:`OpenAIRequest`)."""

    # whether validating this model alone logs its ignored keys (a request body's model)
    warns_ignored_keys: ClassVar[bool] = False

    @model_validator(mode="wrap")
    @classmethod
    def _warn_ignored_keys(cls, data: Any, handler):
        parent = _ignored_keys.get()
        if parent is None and not cls.warns_ignored_keys:
            return handler(data)  # built on its own, not inside a request body
        found: set[str] = set()
        if isinstance(data, dict):
            found.update(k for k in data if k not in _known_keys(cls))
        token = _ignored_keys.set(found)
        try:
            result = handler(data)
        finally:
            _ignored_keys.reset(token)
        # Only a successful validation counts (a union member that does not match adds
        # nothing); the outermost object logs what it and its nested objects ignored.
        if parent is not None:
            parent.update(found)
        elif found:
            logger.warning(
                "The following fields were present in the request but ignored: %s", found
            )
        return result


def _known_keys(cls: type[BaseModel]) -> frozenset[str]:
    """The keys a model reads: each field's alias, and its name where no alias replaces
    it (cached on the class itself)."""
    known = cls.__dict__.get("_known_keys_cache")
    if known is None:
        by_name = bool(cls.model_config.get("populate_by_name"))
        keys = set()
        for name, f in cls.model_fields.items():
            aliases = [a for a in (f.alias, f.validation_alias) if isinstance(a, str)]
            keys.update(aliases)
            if by_name or not aliases:
                keys.add(name)
        known = frozenset(keys)
        type.__setattr__(cls, "_known_keys_cache", known)
    return known


class OpenAIRequest(RequestFields):
    """The base of a request body's model: validating it logs one warning naming the keys
    it and its nested :class:`RequestFields` objects ignored, as upstream's "The following
    fields were present in the request but ignored"."""

    warns_ignored_keys: ClassVar[bool] = True


class SetFieldsOnly(OpenAIBaseModel):
    """A model whose JSON holds only the fields given when it was built (OpenAI's stream
    deltas: ``{"content": "x"}``, never ``{"role": null, "content": "x", ...}``)."""

    @model_serializer(mode="wrap")
    def _set_fields_only(self, handler):
        return {k: v for k, v in handler(self).items() if k in self.model_fields_set}


class ErrorInfo(OpenAIBaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(OpenAIBaseModel):
    """``{"error": {"message", "type", "param", "code"}}`` as OpenAI returns it."""

    error: ErrorInfo


class ModelPermission(OpenAIBaseModel):
    """Upstream's permission entry of a model card (fixed values: no access control)."""

    id: str = Field(default_factory=lambda: f"modelperm-{uuid.uuid4().hex}")
    object: str = "model_permission"
    created: int = Field(default_factory=lambda: int(time.time()))
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: str | None = None
    is_blocking: bool = False


class ModelCard(OpenAIBaseModel):
    """One entry of ``/v1/models``, with upstream's fields (a LoRA adapter's ``root`` is
    its directory and ``parent`` the base model's name; None for the base model)."""

    id: str
    object: str = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "vllm"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    permission: list[ModelPermission] = Field(default_factory=lambda: [ModelPermission()])


class ModelList(OpenAIBaseModel):
    object: str = "list"
    data: list[ModelCard] = Field(default_factory=list)


class PromptTokenUsageInfo(OpenAIBaseModel):
    """``usage.prompt_tokens_details`` (``--enable-prompt-tokens-details``)."""

    cached_tokens: int | None = None


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0
    prompt_tokens_details: PromptTokenUsageInfo | None = None


class StreamOptions(RequestFields):
    """``stream_options``: ``include_usage`` adds a final chunk with the usage;
    ``continuous_usage_stats`` (vLLM's) puts the usage so far on every chunk."""

    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class JsonSchemaFormat(RequestFields):
    """``response_format.json_schema``: ``schema`` is the JSON schema itself."""

    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(RequestFields):
    """OpenAI's ``response_format``: "text" (no constraint), "json_object" (any JSON
    object) or "json_schema" (valid against ``json_schema.schema``)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(RequestFields):
    """Upstream vLLM's ``structured_outputs``: exactly one of ``json`` (a JSON schema),
    ``regex``, ``choice``, ``grammar`` (EBNF), ``json_object`` (true: any JSON object);
    ``structural_tag`` is accepted by the model but refused with a 400 (not served here).
    ``disable_any_whitespace``: JSON without free whitespace."""

    json_schema: str | dict[str, Any] | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | dict[str, Any] | None = None
    disable_any_whitespace: bool = False
    # upstream's options without effect under xgrammar (see GuidedDecodingParams)
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None


class SamplingFields(OpenAIRequest):
    """Sampling fields shared by completions and chat (OpenAI's plus vLLM's extras)."""

    n: int = 1
    # Accepted only as 1 or n (upstream V1 dropped best_of); anything else is a 400.
    best_of: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # token id (a string: JSON object keys are strings) -> bias in [-100, 100] (values
    # beyond it are clamped to it, as upstream: serving_engine.clamped_logit_bias)
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: list[int] | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None
    # words never generated (SamplingParams.bad_words)
    bad_words: list[str] | None = None
    # upstream's per-request logits processors (qualified names): read so that a non-empty
    # list is refused with a 400, as upstream's server without --logits-processor-pattern
    logits_processors: list[Any] | None = None
    # vLLM's: the prompt tokens' logprobs (k most likely at each position, plus the token)
    prompt_logprobs: int | None = None
    # Logprobs tokens as "token_id:ID" (also the server flag --return-tokens-as-token-ids).
    return_tokens_as_token_ids: bool | None = None
    # vLLM's: the prompt's and each choice's token ids in the response (streamed: the
    # prompt's in the first chunk, each chunk's new ids in it)
    return_token_ids: bool | None = None
    # vLLM's: beam search of width n instead of sampling (vllm/beam_search.py)
    use_beam_search: bool = False
    length_penalty: float = 1.0
    # vLLM's: lower is served first (needs --scheduling-policy priority unless 0)
    priority: int = 0
    # vLLM's: prefix-cache blocks are shared only between requests of the same salt
    cache_salt: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    @field_validator("n", "stream", mode="before")
    @classmethod
    def _null_is_default(cls, value, info: ValidationInfo):
        """An explicit null ``n`` or ``stream`` means the default (1, false), as upstream's
        optional fields read it."""
        return cls.model_fields[info.field_name].default if value is None else value

    @field_validator("cache_salt")
    @classmethod
    def _cache_salt_not_empty(cls, value):
        if value is not None and not value:
            raise PydanticCustomError(
                "cache_salt", "cache_salt must be a non-empty string if given (got '')."
            )
        return value

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(cls, value, info: ValidationInfo):
        if value is not None and not info.data.get("stream"):
            raise PydanticCustomError(
                "stream_options",
                "stream_options can only be set when stream is true (got stream=false).",
            )
        return value


class CompletionRequest(SamplingFields):
    model: str | None = None
    # text, token ids, or a list of texts / token-id lists (mixing both is accepted)
    prompt: str | list[int | str | list[int]]
    max_tokens: int | None = 16
    echo: bool = False
    logprobs: int | None = None
    # Refused with a 400 (as upstream): no model here fills in the middle.
    suffix: str | None = None
    # Keep only the last k prompt tokens (k >= 1; -1: the last max_model_len tokens).
    truncate_prompt_tokens: int | None = None
    # The base of the response id and engine request ids (the X-Request-Id header wins).
    request_id: str | None = None
    # vLLM's: the tokenizer's special tokens (a BOS ...) added to text prompts
    add_special_tokens: bool = True

    @field_validator("echo", mode="before")
    @classmethod
    def _null_echo_is_false(cls, value):
        """An explicit null ``echo`` is false, as upstream's optional field reads it."""
        return False if value is None else value


class CompletionLogProbs(OpenAIBaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class PromptLogprob(OpenAIBaseModel):
    """One token's entry in ``prompt_logprobs`` (upstream's shape)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


class CompletionStreamChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    # with return_token_ids: the choice's prompt (streamed: its first chunk only) and the
    # ids this choice (chunk) adds
    prompt_token_ids: list[int] | None = omitted_when_none()
    token_ids: list[int] | None = omitted_when_none()


class CompletionResponseChoice(CompletionStreamChoice):
    """A choice of a non-streamed completion. ``prompt_logprobs`` (when the request asked
    for them): None for the first prompt token, then per prompt token a dict token id ->
    :class:`PromptLogprob` holding that token and the top ``prompt_logprobs`` others."""

    prompt_logprobs: list[dict[int, PromptLogprob] | None] | None = None


class CompletionResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: random_id("cmpl"))
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo


class CompletionStreamResponse(OpenAIBaseModel):
    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionStreamChoice]
    usage: UsageInfo | None = None


class MessageFunction(OpenAIBaseModel):
    """The function of a tool call in an assistant message: ``arguments`` is JSON text
    (OpenAI's form) or an object."""

    name: str
    arguments: str | dict[str, Any]


class MessageToolCall(OpenAIBaseModel):
    """A tool call an earlier assistant message made."""

    id: str
    type: Literal["function"] = "function"
    function: MessageFunction


class ChatMessage(OpenAIBaseModel):
    """One message of a conversation; ``tool_calls`` (assistant), ``tool_call_id``
    (tool) and ``name`` reach the chat template as given."""

    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None


class FunctionDefinition(RequestFields):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ChatCompletionToolsParam(RequestFields):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class ChatCompletionNamedFunction(RequestFields):
    name: str


class ChatCompletionNamedToolChoiceParam(RequestFields):
    type: Literal["function"] = "function"
    function: ChatCompletionNamedFunction


class ChatCompletionRequest(SamplingFields):
    model: str | None = None
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    # vLLM's: the tokenizer's special tokens added on top of the template's (default off:
    # the template writes them)
    add_special_tokens: bool = False
    # the last message is continued: the prompt ends with its content, no end of turn
    continue_final_message: bool = False
    # the reply's content starts with the last message's when that has the reply's role
    echo: bool = False
    chat_template: str | None = None
    # extra variables of the chat template
    chat_template_kwargs: dict[str, Any] | None = None
    # the template's ``documents`` variable (retrieval-augmented templates), as upstream:
    # each a dict of strings such as {"title": ..., "text": ...}
    documents: list[dict[str, str]] | None = None
    # with --reasoning-parser: false drops the reasoning from the reply (as upstream)
    include_reasoning: bool = True
    tools: list[ChatCompletionToolsParam] | None = None
    # vLLM's older top-level structural tag (read so that it is refused with a 400, not
    # ignored: this build does not serve structural tags)
    structural_tag: str | dict[str, Any] | None = None
    # "none", "auto", "required", or {"type": "function", "function": {"name": ...}};
    # None: "auto" when tools are given and the server parses tool calls
    # (--enable-auto-tool-choice), else "none"
    tool_choice: Literal["none", "auto", "required"] | ChatCompletionNamedToolChoiceParam | None = (
        None
    )
    # false: at most one tool call per choice (the first), as upstream
    parallel_tool_calls: bool | None = True
    # Keep only the rendered prompt's last k tokens (k >= 1; -1: the last max_model_len).
    truncate_prompt_tokens: int | None = None
    # The base of the response id and engine request id (the X-Request-Id header wins).
    request_id: str | None = None

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice_form(cls, value):
        """Refuse a tool_choice of neither form with one message naming both (the union's
        own errors name its internal member tags)."""
        if value is None or isinstance(value, ChatCompletionNamedToolChoiceParam):
            return value
        if value in ("none", "auto", "required"):
            return value
        fn = value.get("function") if isinstance(value, dict) else None
        if (
            isinstance(fn, dict)
            and isinstance(fn.get("name"), str)
            and value.get("type", "function") == "function"
        ):
            return value
        raise PydanticCustomError(
            "tool_choice",
            'tool_choice must be "none", "auto", "required" or {"type": "function", '
            '"function": {"name": NAME}}; got {got}.',
            {"got": json.dumps(value, default=repr)[:200]},
        )


class FunctionCall(OpenAIBaseModel):
    name: str
    arguments: str  # JSON text of the arguments


class ToolCall(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: random_id("chatcmpl-tool"))
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaFunctionCall(SetFieldsOnly):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(SetFieldsOnly):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None


class ResponseMessage(OpenAIBaseModel):
    role: str = "assistant"
    content: str | None = None
    # the model's reasoning, split off by --reasoning-parser (upstream's field name)
    reasoning: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatLogProb(OpenAIBaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogProbsContent(ChatLogProb):
    top_logprobs: list[ChatLogProb] = Field(default_factory=list)


class ChatLogProbs(OpenAIBaseModel):
    content: list[ChatLogProbsContent] | None = None


class ChatCompletionResponseChoice(OpenAIBaseModel):
    index: int
    message: ResponseMessage
    logprobs: ChatLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = omitted_when_none()  # with return_token_ids


class ChatCompletionResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: random_id("chatcmpl"))
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo
    # with the request's prompt_logprobs: as a completion choice's (upstream's place)
    prompt_logprobs: list[dict[int, PromptLogprob] | None] | None = None
    prompt_token_ids: list[int] | None = omitted_when_none()  # with return_token_ids


class DeltaMessage(SetFieldsOnly):
    role: str | None = None
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatCompletionStreamChoice(OpenAIBaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = omitted_when_none()  # with return_token_ids: the new ids


class ChatCompletionStreamResponse(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionStreamChoice]
    usage: UsageInfo | None = None
    prompt_token_ids: list[int] | None = omitted_when_none()  # return_token_ids: 1st chunk


class LoadLoRAAdapterRequest(OpenAIRequest):
    """``POST /v1/load_lora_adapter`` (with VLLM_ALLOW_RUNTIME_LORA_UPDATING=1);
    ``load_inplace`` (upstream's field) replaces an adapter already served under the name."""

    lora_name: str
    lora_path: str
    load_inplace: bool = False


class UnloadLoRAAdapterRequest(OpenAIRequest):
    """``POST /v1/unload_lora_adapter`` (with VLLM_ALLOW_RUNTIME_LORA_UPDATING=1);
    ``lora_int_id`` is accepted as upstream and ignored (the name identifies it)."""

    lora_name: str
    lora_int_id: int | None = None
