"""Decode steps travel to stage processes as deltas, not as whole sequences.

Pickling every scheduled sequence's token ids and sampling params for every step grows
with the batch and with the sequences' lengths: 256 decode sequences of ~80 tokens made a
~100 kB request that took milliseconds to pickle on the driver and longer to unpickle on
every stage, each step. Every stage receives every step in the same order, so the driver
keeps, per sequence, how many tokens the stages already hold and sends only the rest:

- a prefill group goes whole (and the stages keep its ``SequenceData`` and params);
- a decode group goes with ``seq_data`` of :class:`SequenceDelta` (the output tokens
  appended since the last send) and ``sampling_params`` None; the stage appends them to
  its copy and restores the params (:meth:`StageRequestCache.expand`).

A recomputed (preempted) sequence is a prefill again and is sent whole. Finished and
aborted sequences are forgotten on both sides (``forget``), through the executor's
``free_sequences`` message, which every stage receives. The in-process executor passes
live objects and uses none of this.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from vllm.sampling_params import SamplingParams
from vllm.sequence import ExecuteModelRequest, SequenceData


@dataclass
class SequenceDelta:
    """Output tokens of one sequence appended since the stages last heard of it."""

    new_token_ids: list[int]
    cumulative_logprob: float


class DriverRequestEncoder:
    """Driver side: replaces decode groups' sequences by deltas (see the module doc)."""

    def __init__(self) -> None:
        self.sent_len: dict[int, int] = {}  # seq_id -> tokens the stages hold

    def encode(self, request: ExecuteModelRequest) -> ExecuteModelRequest:
        """A copy of ``request`` to pickle for the stages (``request`` is not changed)."""
        out = []
        for md in request.seq_group_metadata_list:
            if md.is_prompt or any(s not in self.sent_len for s in md.seq_data):
                for seq_id, data in md.seq_data.items():
                    self.sent_len[seq_id] = data.get_len()
                out.append(md)
                continue
            deltas = {}
            for seq_id, data in md.seq_data.items():
                sent = self.sent_len[seq_id]
                new = data.output_token_ids[sent - data.get_prompt_len() :]
                deltas[seq_id] = SequenceDelta(new, data.cumulative_logprob)
                self.sent_len[seq_id] = data.get_len()
            out.append(dataclasses.replace(md, seq_data=deltas, sampling_params=None))
        return dataclasses.replace(request, seq_group_metadata_list=out)

    def forget(self, seq_ids: list[int]) -> None:
        for seq_id in seq_ids:
            self.sent_len.pop(seq_id, None)


class StageRequestCache:
    """Stage side: the sequences and params of running requests, rebuilt from deltas."""

    def __init__(self) -> None:
        self.data: dict[int, SequenceData] = {}
        self.params: dict[int, SamplingParams] = {}

    def expand(self, request: ExecuteModelRequest | list) -> ExecuteModelRequest | list:
        """Restore whole groups in place (a list: a round of requests).

        Raises:
            KeyError: a delta for a sequence this stage never saw (naming it).
        """
        if isinstance(request, list):
            return [self.expand(r) for r in request]
        for md in request.seq_group_metadata_list:
            first = next(iter(md.seq_data))
            if md.sampling_params is not None and not isinstance(md.seq_data[first], SequenceDelta):
                for seq_id, data in md.seq_data.items():
                    self.data[seq_id] = data
                    self.params[seq_id] = md.sampling_params
                continue
            for seq_id, delta in list(md.seq_data.items()):
                if seq_id not in self.data:
                    raise KeyError(f"sequence {seq_id}: a delta arrived before its prefill.")
                data = self.data[seq_id]
                data.output_token_ids.extend(delta.new_token_ids)
                data.cumulative_logprob = delta.cumulative_logprob
                md.seq_data[seq_id] = data
            md.sampling_params = self.params[first]
        return request

    def forget(self, seq_ids: list[int]) -> None:
        for seq_id in seq_ids:
            self.data.pop(seq_id, None)
            self.params.pop(seq_id, None)
