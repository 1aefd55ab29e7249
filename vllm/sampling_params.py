"""Sampling parameters for one request, as in upstream vLLM (no torch import)."""

from __future__ import annotations

import enum
import json
import math
import numbers
from dataclasses import dataclass, field
from typing import Any

_SAMPLING_EPS = 1e-5
# A seed's range: int64, as upstream's OpenAI protocol bounds it (``seed + i`` of the i-th
# of n sequences then still fits the 64 bits torch.Generator.manual_seed takes).
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

# The guided-decoding backends this build has (upstream's flag value).
GUIDED_DECODING_BACKENDS = ("xgrammar",)
# Upstream's default backend name, "let the engine choose": here always xgrammar.
AUTO_GUIDED_BACKEND = "auto"

# What a sample's ``logprobs`` report (the engine's ``logprobs_mode``, upstream's choices;
# the first is the default): "raw" values come from the model's logits before the sampler
# edits them, "processed" ones from the logits the token is drawn from; "_logprobs" reports
# their log_softmax, "_logits" the logits themselves (vllm/model_executor/layers/sampler.py).
LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")


def resolve_guided_backend(name: str) -> str:
    """``name`` with upstream's "auto" replaced by this build's backend (xgrammar)."""
    return GUIDED_DECODING_BACKENDS[0] if name == AUTO_GUIDED_BACKEND else name


@dataclass(frozen=True)
class GuidedDecodingParams:
    """One structured-output constraint of a request (upstream vLLM's names).

    Exactly one of the constraint fields is set:

    - ``json``: a JSON schema (a dict, or its JSON text); the output is a JSON value valid
      against it.
    - ``regex``: the whole output matches this regular expression.
    - ``choice``: the output is exactly one of these non-empty strings.
    - ``grammar``: an EBNF grammar (xgrammar's / GBNF syntax, start symbol ``root``).
    - ``json_object``: True: any JSON object (OpenAI's ``{"type": "json_object"}``).

    Options: ``backend`` (None or "xgrammar", optionally with upstream's options after a
    colon, comma-separated: "disable-any-whitespace", "no-additional-properties",
    "no-fallback", each setting the field below of its name), ``disable_any_whitespace``: JSON
    without free whitespace between tokens (small models otherwise can emit whitespace
    until ``max_tokens``). Upstream's other options are accepted with what they mean
    under its xgrammar backend: ``disable_additional_properties`` (an object schema with
    ``properties`` and no ``additionalProperties`` allows no other keys: always so here,
    xgrammar's strict mode), ``whitespace_pattern`` (read only by upstream's other backends: no
    effect), ``disable_fallback`` (there is no other backend to fall back to).

    ``reasoning_token_ids`` (set by the server from its ``--reasoning-parser``, not a field
    of any API): the ids of the parser's ``(start, end)`` tags (``<think>``, ``</think>``).
    With it the constraint waits for the reasoning to end: no mask and no grammar step
    until the end tag is generated, then the grammar holds the tokens after it; a prompt
    whose last tag is the end tag (a chat template that closed the reasoning) is
    constrained from the first token (:meth:`reasoning_ended`). None: constrained from
    the first token.

    The constraint is checked by the engine when the request is added (an unparsable
    schema, regex or grammar, or a JSON-schema feature xgrammar does not support, raises
    ValueError there); here only the shape of the arguments is checked.

    Raises:
        ValueError: no constraint or more than one set, an empty or non-string choice, a
            ``json`` that is neither a dict nor a string, an unknown backend.
    """

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    backend: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    disable_fallback: bool = False
    reasoning_token_ids: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.reasoning_token_ids is not None:
            ids = tuple(self.reasoning_token_ids)
            _check(
                len(ids) == 2 and all(is_int(t) for t in ids),
                "reasoning_token_ids must be the (start, end) tag ids, got "
                f"{self.reasoning_token_ids!r}.",
            )
            object.__setattr__(self, "reasoning_token_ids", ids)
        _check(
            self.whitespace_pattern is None or isinstance(self.whitespace_pattern, str),
            f"whitespace_pattern must be a string, got {self.whitespace_pattern!r}.",
        )
        if isinstance(self.choice, (list, tuple)):
            object.__setattr__(self, "choice", list(self.choice))
        set_fields = [k for k in _CONSTRAINTS if getattr(self, k) not in (None, False)]
        _check(
            len(set_fields) == 1,
            "guided decoding needs exactly one of json, regex, choice, grammar, json_object; "
            f"got {set_fields or 'none'}.",
        )
        if self.json is not None:
            _check(
                isinstance(self.json, (dict, str)),
                f"guided json must be a JSON schema (dict or str), got {type(self.json).__name__}.",
            )
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None:
                _check(
                    isinstance(value, str) and value != "",
                    f"guided {name} must be a non-empty string, got {value!r}.",
                )
        if self.choice is not None:
            _check(
                isinstance(self.choice, list)
                and len(self.choice) > 0
                and all(isinstance(c, str) and c for c in self.choice),
                "guided choice must be a non-empty list of non-empty strings, got "
                f"{self.choice!r}.",
            )
        if self.backend is not None:
            name, _, option = self.backend.partition(":")
            options = option.split(",") if option else []
            _check(
                resolve_guided_backend(name) in GUIDED_DECODING_BACKENDS
                and all(o in _BACKEND_OPTIONS for o in options),
                f"guided decoding backend must be one of "
                f"{[AUTO_GUIDED_BACKEND, *GUIDED_DECODING_BACKENDS]} "
                f"(options after ':', comma-separated: {', '.join(_BACKEND_OPTIONS)}), "
                f"got {self.backend!r}.",
            )
            if name == AUTO_GUIDED_BACKEND:
                resolved = resolve_guided_backend(name) + (f":{option}" if option else "")
                object.__setattr__(self, "backend", resolved)
            for o in options:
                object.__setattr__(self, _BACKEND_OPTIONS[o], True)

    @property
    def kind(self) -> str:
        """Which constraint is set: "json", "regex", "choice", "grammar" or "json_object"."""
        return next(k for k in _CONSTRAINTS if getattr(self, k) not in (None, False))

    def reasoning_ended(self, token_ids) -> bool:
        """Whether the reasoning is over after ``token_ids``, upstream's rule: the last
        reasoning tag among them is the end tag. True without ``reasoning_token_ids``
        (nothing to wait for)."""
        if self.reasoning_token_ids is None:
            return True
        start, end = self.reasoning_token_ids
        for tok in reversed(token_ids):
            if tok == end:
                return True
            if tok == start:
                return False
        return False

    def key(self) -> tuple[str, str, bool]:
        """(kind, text, disable_any_whitespace): equal for equal constraints, the grammar
        cache's key (a dict schema is serialized in its own key order, which is the order
        its properties are generated in)."""
        kind = self.kind
        value: Any = getattr(self, kind)
        if kind == "json" and isinstance(value, dict):
            value = json.dumps(value)
        elif kind == "choice":
            value = json.dumps(value)
        elif kind == "json_object":
            value = ""
        return kind, value, self.disable_any_whitespace


_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object")
# Upstream's backend options ("xgrammar:opt1,opt2") -> the field each one sets.
_BACKEND_OPTIONS = {
    "disable-any-whitespace": "disable_any_whitespace",
    "no-additional-properties": "disable_additional_properties",
    "no-fallback": "disable_fallback",
}


@dataclass(frozen=True)
class StructuredOutputsParams(GuidedDecodingParams):
    """Upstream vLLM's current name for a constraint (``SamplingParams.structured_outputs``):
    the fields of :class:`GuidedDecodingParams`, plus ``structural_tag``, which this build
    does not serve.

    Raises:
        ValueError: ``structural_tag`` set, or any error of :class:`GuidedDecodingParams`.
    """

    structural_tag: str | dict | None = None

    def __post_init__(self) -> None:
        _check(
            self.structural_tag is None,
            "structural_tag is not supported by this build's structured outputs (use json, "
            "regex, choice, grammar or json_object).",
        )
        super().__post_init__()


# Fields that must be ints (None allowed where the field's default is None) or numbers.
_INT_FIELDS = ("n", "top_k", "seed", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs",
               "truncate_prompt_tokens")  # fmt: skip
_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty")  # fmt: skip


class RequestOutputKind(enum.IntEnum):
    """What a streamed request yields after each step (``SamplingParams.output_kind``),
    with upstream vLLM's names and values."""

    CUMULATIVE = 0  # the whole output so far
    DELTA = 1  # only the tokens, text and logprobs new since the last yield
    FINAL_ONLY = 2  # nothing until the request finishes


@dataclass
class SamplingParams:
    """How the tokens of one request are chosen and when its generation stops.

    Semantics follow upstream vLLM's ``SamplingParams``:

    - ``temperature == 0`` means greedy (argmax); ``top_k`` 0 or -1 disables top-k (0 is
      stored as -1); ``top_p == 1`` and ``min_p == 0`` disable those filters.
    - ``presence_penalty`` / ``frequency_penalty`` follow the OpenAI API definition
      (subtracted from logits once per present token / once per occurrence of generated
      tokens); ``repetition_penalty`` follows the CTRL paper (arXiv:1909.05858): positive
      logits of seen tokens (prompt and output) divided by it, negative ones multiplied.
    - ``max_tokens=None`` means up to ``max_model_len`` in total.
    - ``best_of`` (upstream V0's name) is accepted only as None or ``n``: all ``n``
      sequences are returned, none is generated only to be ranked away.
    - ``logprobs=k`` returns the sampled token's logprob plus the top-k per position (ranks
      by value); what the values are is the engine's ``logprobs_mode`` (upstream's
      ``--logprobs-mode``): ``raw_logprobs`` (the default) the log_softmax of the model's
      logits, before logit_bias, allowed_token_ids, bad_words, penalties, min_tokens,
      structured outputs and temperature; ``processed_logprobs`` the log_softmax of the
      logits the token is drawn from (after all of those, then, unless greedy,
      temperature and the top-k / top-p / min-p filters, -inf for a filtered token; a
      greedy row's at temperature 1 without filters); ``raw_logits`` and
      ``processed_logits`` the same logits without the log_softmax. A sequence's
      ``cumulative_logprob`` sums the reported values. ``prompt_logprobs=k`` does the
      same for prompt positions, always from the model's raw logprobs (the engine also
      rejects k above the vocabulary size). ``-1`` (as upstream) means every token of the
      vocabulary, allowed only when ``max_logprobs`` is -1 or at least the vocabulary size.
    - ``seed``: the request's sequences draw from their own generators, seeded with
      ``seed + i`` for the i-th of the ``n`` sequences: reproducible whatever else is in
      the batch, and different from each other. A 64-bit signed integer.
    - ``min_tokens``: EOS and ``stop_token_ids`` are masked out (logit -inf) until that
      many tokens were generated; stop strings are not checked before it either. With
      ``guided_decoding`` a grammar that completes sooner still ends the sequence (its
      end-of-sequence token is the one token it allows; vllm/engine/stop_checker.py).
    - Stop handling (EOS, stop_token_ids, stop strings) is described in
      ``vllm/engine/stop_checker.py``.
    - ``logit_bias`` (OpenAI API): token id -> bias in [-100, 100], added to that token's
      logit before anything else (penalties, temperature, filters; the reported logprobs
      include it only under a processed ``logprobs_mode``). Keys may be ints or strings
      of ints (JSON object keys are strings).
    - ``allowed_token_ids`` (vLLM's name): only these tokens can be generated; every other
      token's logit is set to -inf (before ``logit_bias`` is added).
    Both are checked against the vocabulary when the engine adds the request.
    - ``bad_words`` (vLLM's name): strings never generated; the engine tokenizes them
      into ``bad_words_token_ids`` when the request is added, and the sampler bans the
      last token of a word when the tokens generated before it spell the rest
      (``vllm/bad_words.py`` states the rule).
    - ``guided_decoding`` (vLLM's name): a :class:`GuidedDecodingParams` constraint; each
      sequence (of the ``n``) follows it with its own grammar state, and stops (finish
      reason "stop") once the grammar is complete and EOS was generated.
      ``structured_outputs`` (upstream's current name): a :class:`StructuredOutputsParams`;
      when given it becomes ``guided_decoding`` (setting both to different constraints
      is a ValueError).
    - ``output_kind`` (vLLM's name, :class:`RequestOutputKind`): what
      ``AsyncLLMEngine.generate`` yields and ``LLMEngine.step`` returns after each step:
      everything so far (CUMULATIVE), only what is new (DELTA), or only the finished
      output (FINAL_ONLY). ``LLM`` returns finished outputs whatever the kind.
    - ``truncate_prompt_tokens`` (vLLM's name): keep only the prompt's last k tokens (-1:
      the last ``max_model_len``); checked against ``max_model_len`` when the engine adds
      the request.
    - ``logits_processors``: per-request Python callables are not supported (upstream's V1
      engine dropped them as well); a non-empty list is a ValueError naming the
      alternatives. ``extra_args``: kept on the params for extensions; the engine reads none.

    Raises:
        ValueError: on any out-of-range value; the message names the field, the value and
            the allowed range (:meth:`verify`).
    """

    n: int = 1
    best_of: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    guided_decoding: GuidedDecodingParams | None = None
    structured_outputs: StructuredOutputsParams | None = None
    bad_words: list[str] | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    truncate_prompt_tokens: int | None = None
    logits_processors: list[Any] | None = None
    extra_args: dict[str, Any] | None = None
    # Filled by the engine: the tokens that end the request besides stop_token_ids.
    all_stop_token_ids: set[int] = field(default_factory=set, repr=False)
    # Filled by the engine: bad_words as token sequences (vllm/bad_words.py).
    bad_words_token_ids: list[list[int]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        try:
            self.output_kind = RequestOutputKind(self.output_kind)
        except ValueError:
            raise ValueError(
                f"output_kind must be one of {[k.name for k in RequestOutputKind]}, got "
                f"{self.output_kind!r}."
            ) from None
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        elif isinstance(self.stop, (list, tuple)):
            self.stop = list(self.stop)
        else:
            raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}.")
        self.stop_token_ids = [as_int(t) for t in self.stop_token_ids or []]
        self.all_stop_token_ids = set(self.stop_token_ids)
        for name in _INT_FIELDS:  # numpy ints too; anything else fails verify()
            setattr(self, name, as_int(getattr(self, name)))
        self.logit_bias = _token_bias(self.logit_bias) or None
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = [as_int(t) for t in self.allowed_token_ids]
        if isinstance(self.bad_words, str):
            self.bad_words = [self.bad_words]
        elif self.bad_words is not None:
            self.bad_words = list(self.bad_words)
        if self.structured_outputs is not None:
            _check(
                isinstance(self.structured_outputs, GuidedDecodingParams),
                "structured_outputs must be a StructuredOutputsParams, got "
                f"{type(self.structured_outputs).__name__}.",
            )
            _check(
                self.guided_decoding is None or self.guided_decoding is self.structured_outputs,
                "structured_outputs and guided_decoding are two spellings of one constraint; "
                "set only one.",
            )
            self.guided_decoding = self.structured_outputs
        self.verify()

    @property
    def greedy(self) -> bool:
        """True when tokens are chosen by argmax (temperature below 1e-5)."""
        return self.temperature < _SAMPLING_EPS

    def verify(self) -> None:
        """Check every field against its range.

        Raises:
            ValueError: naming the field, the bad value and the limit (or the type expected).
        """
        _check(
            not self.logits_processors,
            "logits_processors are not supported (per-request Python callables; upstream's V1 "
            "engine dropped them too): use logit_bias, allowed_token_ids, bad_words or "
            "guided_decoding.",
        )
        for name in _INT_FIELDS:
            value = getattr(self, name)
            _check(
                value is None
                or (isinstance(value, numbers.Integral) and not isinstance(value, bool)),
                f"{name} must be an integer, got {value!r} ({type(value).__name__}).",
            )
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            _check(
                isinstance(value, numbers.Real) and not isinstance(value, bool),
                f"{name} must be a number, got {value!r} ({type(value).__name__}).",
            )
            _check(math.isfinite(value), f"{name} must be a finite number, got {value!r}.")
        if self.truncate_prompt_tokens is not None:  # an int, checked above
            _check(
                self.truncate_prompt_tokens >= 1 or self.truncate_prompt_tokens == -1,
                "truncate_prompt_tokens must be >= 1 (or -1 for max_model_len), got "
                f"{self.truncate_prompt_tokens!r}.",
            )
        _check(
            isinstance(self.n, int) and self.n >= 1, f"n must be an integer >= 1, got {self.n!r}."
        )
        _check(
            self.best_of is None or self.best_of == self.n,
            f"best_of={self.best_of!r} is not supported: it must be None or equal to n={self.n} "
            "(every generated sequence is returned; upstream's V1 engine dropped best_of > n "
            "as well).",
        )
        _check(
            -2.0 <= self.presence_penalty <= 2.0,
            f"presence_penalty must be in [-2, 2], got {self.presence_penalty}.",
        )
        _check(
            -2.0 <= self.frequency_penalty <= 2.0,
            f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}.",
        )
        _check(
            self.repetition_penalty > 0.0,
            f"repetition_penalty must be greater than zero, got {self.repetition_penalty}.",
        )
        _check(
            self.temperature >= 0.0,
            f"temperature must be >= 0 (0 = greedy), got {self.temperature}.",
        )
        _check(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}.")
        _check(
            self.top_k >= -1,
            f"top_k must be 0 or -1 (disable), or at least 1, got {self.top_k}.",
        )
        if self.top_k == 0:  # upstream's current "off"; -1 (its older one) is kept here
            self.top_k = -1
        _check(0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}.")
        if self.max_tokens is not None:
            _check(
                isinstance(self.max_tokens, int) and self.max_tokens >= 1,
                f"max_tokens must be an integer >= 1 (or None), got {self.max_tokens!r}.",
            )
        _check(self.min_tokens >= 0, f"min_tokens must be at least 0, got {self.min_tokens}.")
        if self.max_tokens is not None:
            _check(
                self.min_tokens <= self.max_tokens,
                f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, "
                f"got {self.min_tokens}.",
            )
        if self.seed is not None:
            _check(
                _INT64_MIN <= self.seed <= _INT64_MAX,
                f"seed must be a 64-bit signed integer in [{_INT64_MIN}, {_INT64_MAX}], "
                f"got {self.seed}.",
            )
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None:
                _check(k >= -1, f"{name} must be >= 0, or -1 for the full vocabulary, got {k}.")
        for s in self.stop:
            _check(
                isinstance(s, str) and len(s) > 0,
                f"stop strings must be non-empty strings (length >= 1), got {s!r}.",
            )
        for t in self.stop_token_ids:
            _check(
                isinstance(t, int) and t >= 0, f"stop_token_ids must be >= 0 integers, got {t!r}."
            )
        if self.allowed_token_ids is not None:
            _check(
                len(self.allowed_token_ids) > 0,
                "allowed_token_ids must list at least one token id, got [].",
            )
            for t in self.allowed_token_ids:
                _check(
                    is_int(t) and t >= 0,
                    f"allowed_token_ids must be integers >= 0, got {t!r}.",
                )
        for w in self.bad_words or ():
            _check(
                isinstance(w, str) and w.strip() != "",
                f"bad_words must be non-empty strings, got {w!r}.",
            )
        if self.guided_decoding is not None:
            _check(
                isinstance(self.guided_decoding, GuidedDecodingParams),
                "guided_decoding must be a GuidedDecodingParams, got "
                f"{type(self.guided_decoding).__name__}.",
            )
        if self.stop and not self.detokenize:
            raise ValueError("stop strings are only supported when detokenize is True.")

    def clone(self) -> SamplingParams:
        """A deep-enough copy (lists copied) for per-request mutation by the engine."""
        p = SamplingParams(**{k: getattr(self, k) for k in _INIT_FIELDS})
        p.all_stop_token_ids = set(self.all_stop_token_ids)
        p.bad_words_token_ids = [list(s) for s in self.bad_words_token_ids]
        return p


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def is_int(value) -> bool:
    """Whether ``value`` is a Python int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def as_int(value):
    """``value`` as a Python int when it is an integer of another type (numpy's, say);
    anything else unchanged (bools too), for the checks to name."""
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, int)):
        return int(value)
    return value


def _token_bias(bias) -> dict[int, float]:
    """``logit_bias`` with int keys and float values, checked (OpenAI's limits).

    Raises:
        ValueError: not a dict; a key that is not a token id (an int >= 0, or a string
            of one); a value that is not a number in [-100, 100]. The message names the
            key or value.
    """
    if bias is None:
        return {}
    if not isinstance(bias, dict):
        raise ValueError(
            f"logit_bias must be a dict of token id -> bias, got {type(bias).__name__}."
        )
    out: dict[int, float] = {}
    for key, value in bias.items():
        tok = as_int(key)
        if isinstance(key, str) and key.strip().isdigit():
            tok = int(key)
        if not is_int(tok) or tok < 0:
            raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {key!r}.")
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok or not -100.0 <= value <= 100.0:
            raise ValueError(
                f"logit_bias value for token {tok} must be a number in [-100, 100], got {value!r}."
            )
        out[tok] = float(value)
    return out


_INIT_FIELDS = [
    f
    for f in SamplingParams.__dataclass_fields__
    if f not in ("all_stop_token_ids", "bad_words_token_ids")
]


@dataclass
class BeamSearchParams:
    """Parameters of one beam search (vllm/beam_search.py; :meth:`vllm.LLM.beam_search`).

    Args:
        beam_width: beams kept per step and sequences returned (>= 1).
        max_tokens: tokens generated at most per beam (>= 1).
        ignore_eos: never complete a beam at an end-of-sequence id.
        temperature: the steps' sampling temperature (0: greedy); it scales the logits
            the beams are scored with only under a processed ``logprobs_mode`` (the
            default, raw_logprobs, scores with the model's own logprobs), as upstream.
        length_penalty: the exponent of the length in the score (module docstring).
        include_stop_str_in_output: keep the final EOS token's text in ``text``.

    Raises:
        ValueError: beam_width or max_tokens below 1, or a negative temperature.
    """

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        if self.beam_width < 1:
            raise ValueError(f"beam_width must be at least 1, got {self.beam_width}.")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if not self.temperature >= 0 or not math.isfinite(self.temperature):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}.")
        if not math.isfinite(self.length_penalty):
            raise ValueError(f"length_penalty must be a finite number, got {self.length_penalty}.")

    def check_limits(self, max_logprobs: int) -> None:
        """Raises ValueError when a step's ``2 x beam_width`` logprobs exceed the engine's
        ``max_logprobs`` (-1: no limit)."""
        if max_logprobs >= 0 and 2 * self.beam_width > max_logprobs:
            raise ValueError(
                f"beam_width={self.beam_width} needs {2 * self.beam_width} logprobs per step, "
                f"more than max_logprobs={max_logprobs} (raise --max-logprobs, or lower "
                "beam_width)."
            )

    def step_params(self) -> SamplingParams:
        """The SamplingParams of one step: one token, ``2 x beam_width`` logprobs."""
        return SamplingParams(
            n=1,
            max_tokens=1,
            temperature=self.temperature,
            logprobs=2 * self.beam_width,
            ignore_eos=True,
            detokenize=False,
        )
