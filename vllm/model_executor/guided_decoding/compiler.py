"""Parsing and compiling guided-decoding constraints with xgrammar, cached.

Parsing (constraint -> ``xgrammar.Grammar``) is fast and runs on the caller's thread, so
bad input fails at once with a ValueError. Compiling (the per-token mask tables for one
tokenizer) is the slow part and runs on a small thread pool; its futures are cached by
the constraint's key, and one cache belongs to one tokenizer (see :func:`grammar_cache`),
so the cache key is (constraint, tokenizer).
"""

from __future__ import annotations

import json
import os
import re
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from vllm.model_executor.guided_decoding.schema_support import unenforced_keywords
from vllm.sampling_params import GuidedDecodingParams

# Compiled grammars kept per tokenizer (oldest dropped first).
MAX_CACHED_GRAMMARS = 512


XGRAMMAR_REQUIREMENT = "xgrammar==0.2.9"


def import_xgrammar():
    """The ``xgrammar`` module, imported on first use of a structured-output constraint.

    Raises:
        ImportError: xgrammar is not installed; the message names the package to install
            (it is in requirements-cpu.txt and requirements-cuda.txt).
    """
    try:
        import xgrammar
    except ImportError as e:
        raise ImportError(
            "structured outputs (guided_decoding, guided_json/regex/choice/grammar, "
            "response_format) need the xgrammar package, which is not installed here "
            f"({e}); install it with: pip install --no-deps {XGRAMMAR_REQUIREMENT} "
            "apache-tvm-ffi"
        ) from None
    return xgrammar


def parse_grammar(gd: GuidedDecodingParams):
    """The xgrammar ``Grammar`` of one constraint.

    Raises:
        ValueError: naming the constraint kind and xgrammar's reason (invalid JSON or
            schema, an unsupported schema feature, an unparsable regex or EBNF grammar),
            or the schema keywords xgrammar would compile without enforcing
            (:mod:`.schema_support`).
    """
    xgr = import_xgrammar()

    kind, text, compact = gd.key()
    try:
        if kind == "json":
            _check_enforceable(json.loads(text))  # json.loads: clearer than xgrammar's
            ws = dict(any_whitespace=not compact)
            return xgr.Grammar.from_json_schema(text, strict_mode=True, **ws)
        if kind == "json_object":  # OpenAI's json_object: an object, not any JSON value
            return xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=not compact)
        if kind == "regex":
            return xgr.Grammar.from_regex(text)
        if kind == "choice":
            alts = " | ".join(_ebnf_literal(c) for c in gd.choice)
            return xgr.Grammar.from_ebnf(f"root ::= {alts}")
        return xgr.Grammar.from_ebnf(text)
    except (RuntimeError, ValueError, TypeError) as e:
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        hint = _grammar_hint(text) if kind == "grammar" else ""
        raise ValueError(f"invalid guided {kind}: {_strip_location(reason)}{hint}") from None


def _check_enforceable(schema) -> None:
    """Raise ValueError listing the keywords of ``schema`` xgrammar would not enforce."""
    found = unenforced_keywords(schema)
    if found:
        raise ValueError(
            "the JSON schema uses keywords xgrammar cannot enforce (the output could break "
            f"the schema): {'; '.join(found)}"
        )


# A Lark rule definition: ``name: ...`` (optionally ``?name`` / ``!name``), not ``::=``.
_LARK_RULE = re.compile(r"^\s*[?!]?[A-Za-z_][\w.]*\s*:(?!:=)", re.MULTILINE)


def _grammar_hint(text: str) -> str:
    """What to tell the sender of a grammar xgrammar refused: the syntax it reads, and,
    when ``text`` reads as Lark (``start: ...`` rules), that Lark is not accepted (xgrammar
    has no Lark reader)."""
    lark = (
        " This looks like a Lark grammar, which is not accepted."
        if ("::=" not in text and _LARK_RULE.search(text))
        else ""
    )
    return (
        f".{lark} A grammar must be EBNF / GBNF as xgrammar reads it: rules "
        '`name ::= ...` with the start rule named root, e.g. root ::= "yes" | "no"'
    )


def _ebnf_literal(s: str) -> str:
    """An EBNF string literal matching ``s`` exactly (JSON escapes, which xgrammar reads)."""
    return json.dumps(s, ensure_ascii=False)


def _strip_location(reason: str) -> str:
    """xgrammar prefixes messages with a time and C++ source location; drop them."""
    if reason.startswith("[") and "]" in reason:
        reason = reason.split("]", 1)[1].strip()
    head, sep, tail = reason.partition(": ")
    if sep and ".cc:" in head:
        return tail
    return reason


class GrammarCache:
    """Compiled grammars of one tokenizer, compiled off the caller's thread.

    Args:
        tokenizer: a transformers tokenizer.
        vocab_size: the model's logits width (may exceed the tokenizer's length).
        stop_token_ids: tokens that end a grammar (EOS).
        max_threads: compile threads.
    """

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int], max_threads=2):
        xgr = import_xgrammar()

        self.vocab_size = vocab_size
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids
        )
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._pool = ThreadPoolExecutor(max_threads, thread_name_prefix="vllm-grammar")
        self._lock = threading.Lock()
        self._futures: dict[tuple, Future] = {}
        self.num_compiled = 0  # compilations started (cache misses)

    def get(self, gd: GuidedDecodingParams) -> Future:
        """The future compiled grammar of ``gd`` (cached; done at once on a hit).

        Raises:
            ValueError: ``gd`` does not parse (see :func:`parse_grammar`); nothing is cached.
        """
        key = gd.key()
        with self._lock:
            fut = self._futures.get(key)
        if fut is not None:
            return fut
        grammar = parse_grammar(gd)
        with self._lock:
            fut = self._futures.get(key)
            if fut is None:
                fut = self._pool.submit(self._compile, grammar, key[0])
                self._futures[key] = fut
                self.num_compiled += 1
                while len(self._futures) > MAX_CACHED_GRAMMARS:
                    self._futures.pop(next(iter(self._futures)))
        return fut

    def _compile(self, grammar, kind: str):
        """Compile ``grammar`` (on a pool thread) and refuse one that no token can start:
        a schema that matches nothing (a ``$ref`` cycle through ``anyOf``, say) parses and
        compiles, and would otherwise fail its request at the first step.

        Raises:
            ValueError: not even a stop token is allowed at the start.
        """
        xgr = import_xgrammar()

        compiled = self._compiler.compile_grammar(grammar)
        matcher = xgr.GrammarMatcher(compiled)
        mask = xgr.allocate_token_bitmask(1, self.vocab_size)  # [1, ceil(vocab / 32)] int32
        matcher.fill_next_token_bitmask(mask)
        if not bool(mask.any()):
            raise ValueError(
                f"the {kind} constraint can never be satisfied: no token (not even the end "
                "of sequence) may start it."
            )
        return compiled


_CACHES: dict[tuple, GrammarCache] = {}
_CACHES_LOCK = threading.Lock()


def grammar_cache(tokenizer, tokenizer_key: str, vocab_size: int, stop_ids: list[int]):
    """The process-wide :class:`GrammarCache` of a tokenizer (one per key, built once; a
    forked child builds its own, since its parent's compile threads do not exist there)."""
    key = (os.getpid(), tokenizer_key, vocab_size, tuple(stop_ids))
    with _CACHES_LOCK:
        cache = _CACHES.get(key)
        if cache is None:
            cache = GrammarCache(tokenizer, vocab_size, stop_ids)
            _CACHES[key] = cache
        return cache
