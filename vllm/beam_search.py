"""Beam search over the engine, as upstream vLLM's ``LLM.beam_search`` and the server's
``use_beam_search``: the engine samples nothing itself; each step asks it for one token of
every live beam with ``2 x beam_width`` logprobs, and this module keeps the best beams.

One step, per prompt:

1. every live beam ``b`` proposes its ``2 x beam_width`` most likely next tokens ``t``, each a
   candidate with cumulative logprob ``cum(b) + logprob(t | b)``;
2. a candidate ending in an end-of-sequence id (unless ``ignore_eos``) is complete: it leaves
   the search with finish reason "stop";
3. of the other candidates the ``beam_width`` best by score live on. Twice the width is
   enough: at most ``beam_width`` of a beam's candidates can end in EOS.

A beam also completes ("length") at ``max_tokens`` generated tokens or at the model's length
limit. At the end the completed and live beams are ranked by score and the best
``beam_width`` returned. Score (upstream's convention): ``cum_logprob / L ** length_penalty``
with ``L`` the sequence length, prompt included, not counting a final EOS; among beams of one
length it orders as the cumulative logprob does.

The prompts of a step share their prefixes, so prefix caching (on by default) computes only
each beam's new token.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import BeamSearchParams
from vllm.sequence import PositionLogprobs


@dataclass
class BeamSearchSequence:
    """One beam.

    Attributes:
        tokens: prompt and generated token ids.
        logprobs: per generated token, its step's candidate logprobs (token id -> Logprob).
        cum_logprob: natural-log probability of the generated tokens given the prompt.
        text: the generated tokens' text (set when the search ends).
        finish_reason: "stop" (EOS), "length", or None while live.
    """

    tokens: list[int]
    logprobs: list[PositionLogprobs] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None


@dataclass
class BeamSearchOutput:
    """The result for one prompt: the best ``beam_width`` sequences, best first."""

    sequences: list[BeamSearchSequence]


def beam_score(seq: BeamSearchSequence, eos_ids: set[int], length_penalty: float) -> float:
    """``cum_logprob / L ** length_penalty``; L = len(tokens), less a final EOS."""
    length = len(seq.tokens)
    if seq.tokens and seq.tokens[-1] in eos_ids and seq.finish_reason == "stop":
        length -= 1
    return seq.cum_logprob / max(length, 1) ** length_penalty


class BeamSearch:
    """The state of a beam search over several prompts (drivers: ``LLM.beam_search`` and
    the OpenAI server).

    Args:
        prompts: token ids per prompt.
        params: the search's parameters.
        eos_ids: end-of-sequence ids (the tokenizer's and generation_config's).
        max_model_len: the longest sequence the engine takes.
    """

    def __init__(
        self,
        prompts: list[list[int]],
        params: BeamSearchParams,
        eos_ids: Iterable[int],
        max_model_len: int,
    ):
        self.params = params
        self.eos_ids = set(eos_ids)
        self.max_model_len = max_model_len
        self.prompt_lens = [len(p) for p in prompts]
        self.live: list[list[BeamSearchSequence]] = [[BeamSearchSequence(list(p))] for p in prompts]
        self.completed: list[list[BeamSearchSequence]] = [[] for _ in prompts]
        for i in range(len(prompts)):
            self._retire_full(i)

    @classmethod
    def for_engine(cls, engine, prompts: list[list[int]], params: BeamSearchParams) -> BeamSearch:
        """A search over ``engine`` (an LLMEngine): its end ids and length limit.

        Raises:
            ValueError: ``2 x beam_width`` above the engine's max_logprobs.
        """
        params.check_limits(engine.model_config.max_logprobs)
        return cls(prompts, params, engine.end_token_ids(), engine.scheduler_config.max_model_len)

    @property
    def done(self) -> bool:
        return not any(self.live)

    def pending(self) -> list[tuple[int, int, list[int]]]:
        """(prompt index, beam index, token ids) of every live beam: one engine request
        each for this step."""
        return [(i, j, b.tokens) for i, beams in enumerate(self.live) for j, b in enumerate(beams)]

    def advance(self, results: dict[tuple[int, int], PositionLogprobs]) -> None:
        """Apply one step: ``results[(i, j)]`` is the candidate logprobs of live beam ``j``
        of prompt ``i`` (every pending beam must have one).

        Raises:
            KeyError: a pending beam has no result.
        """
        width = self.params.beam_width
        for i, beams in enumerate(self.live):
            candidates = []
            for j, beam in enumerate(beams):
                cands = results[(i, j)]
                top = sorted(cands.items(), key=lambda kv: -kv[1].logprob)[: 2 * width]
                for tok, lp in top:  # (a sampled token outside the top 2 x width is left out)
                    new = BeamSearchSequence(
                        beam.tokens + [tok], beam.logprobs + [cands], beam.cum_logprob + lp.logprob
                    )
                    if tok in self.eos_ids and not self.params.ignore_eos:
                        new.finish_reason = "stop"
                        self.completed[i].append(new)
                    else:
                        candidates.append(new)
            candidates.sort(key=self._key, reverse=True)
            self.live[i] = candidates[:width]
            self._retire_full(i)

    def _retire_full(self, i: int) -> None:
        """Complete (finish reason "length") the live beams of prompt ``i`` that reached
        max_tokens or, after at least one new token, the model's length (a prompt of
        exactly max_model_len tokens gets one token per beam, as generation gives it one)."""
        keep = []
        for beam in self.live[i]:
            generated = len(beam.tokens) - self.prompt_lens[i]
            full = generated > 0 and len(beam.tokens) >= self.max_model_len
            if generated >= self.params.max_tokens or full:
                beam.finish_reason = "length"
                self.completed[i].append(beam)
            else:
                keep.append(beam)
        self.live[i] = keep

    def _key(self, seq: BeamSearchSequence) -> float:
        return beam_score(seq, self.eos_ids, self.params.length_penalty)

    def outputs(self, tokenizer) -> list[BeamSearchOutput]:
        """The best ``beam_width`` sequences of each prompt, best first, with their text:
        ``tokenizer.decode(ids, skip_special_tokens=True)`` of the generated tokens (the
        final EOS's text only with ``include_stop_str_in_output``; "" without a tokenizer)."""
        if tokenizer is None:
            decode = lambda ids: ""  # noqa: E731
        else:
            decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        outs = []
        for i, done in enumerate(self.completed):
            best = sorted(done + self.live[i], key=self._key, reverse=True)[
                : self.params.beam_width
            ]
            for seq in best:
                gen = seq.tokens[self.prompt_lens[i] :]
                if seq.finish_reason == "stop" and not self.params.include_stop_str_in_output:
                    gen = gen[:-1]
                seq.text = decode(gen)
            outs.append(BeamSearchOutput(best))
        return outs


def to_request_output(
    request_id: str, prompt: str | None, prompt_ids: list[int], result: BeamSearchOutput
) -> RequestOutput:
    """A finished RequestOutput whose ``outputs`` are ``result``'s sequences, best first
    (index 0 the best): the form the OpenAI server renders as choices."""
    n = len(prompt_ids)
    outs = [
        CompletionOutput(
            index=i,
            text=seq.text or "",
            token_ids=seq.tokens[n:],
            cumulative_logprob=seq.cum_logprob,
            logprobs=list(seq.logprobs),
            finish_reason=seq.finish_reason,
        )
        for i, seq in enumerate(result.sequences)
    ]
    return RequestOutput(request_id, prompt, list(prompt_ids), None, outs, finished=True)
