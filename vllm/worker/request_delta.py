"""Decode steps travel to stage processes as deltas, not as whole sequences.

Pickling every scheduled sequence's token ids and sampling params for every step grows
with the batch and with the sequences' lengths: 256 decode sequences of ~80 tokens made a
~100 kB request that took milliseconds to pickle on the driver and longer to unpickle on
every stage, each step. Every stage receives every step in the same order, so the driver
keeps, per sequence, how many tokens the stages already hold and sends only the rest:

- a prefill group goes whole (and the stages keep its ``SequenceData``, params and LoRA
  adapter);
- a decode group goes as a plain tuple (:data:`DecodeRow`: request id, per sequence the
  output tokens appended since the last send and the cumulative logprob, block tables,
  and the group's few step fields): tuples pickle and unpickle several times faster than
  dataclass instances, and no ``SamplingParams`` travels; the stage appends the tokens to
  its copy and rebuilds the group (:meth:`StageRequestCache.expand`).

A recomputed (preempted) sequence is a prefill again and is sent whole. Finished and
aborted sequences are forgotten on both sides (``forget``), through the executor's
``free_sequences`` message, which every stage receives. The in-process executor passes
live objects and uses none of this.
"""

from __future__ import annotations

import dataclasses

from vllm.sampling_params import SamplingParams
from vllm.sequence import ExecuteModelRequest, SequenceData, SequenceGroupMetadata

# A decode group on the wire: (request_id, {seq_id: (new_token_ids, cumulative_logprob)},
# block_tables, do_sample, computed_lens, token_chunk_size, guided_bitmasks).
DecodeRow = tuple


class DriverRequestEncoder:
    """Driver side: replaces decode groups by :data:`DecodeRow` deltas (see the module
    doc)."""

    def __init__(self) -> None:
        self.sent_len: dict[int, int] = {}  # seq_id -> tokens the stages hold

    def encode(self, request: ExecuteModelRequest) -> ExecuteModelRequest:
        """A copy of ``request`` to pickle for the stages (``request`` is not changed)."""
        out: list = []
        sent_len = self.sent_len
        for md in request.seq_group_metadata_list:
            seq_data = md.seq_data
            if md.is_prompt or any(s not in sent_len for s in seq_data):
                for seq_id, data in seq_data.items():
                    sent_len[seq_id] = data.get_len()
                out.append(md)
                continue
            deltas = {}
            for seq_id, data in seq_data.items():
                outputs = data.output_token_ids
                prompt_len = len(data.prompt_token_ids)
                new_ids = outputs[sent_len[seq_id] - prompt_len :]
                deltas[seq_id] = (new_ids, data.cumulative_logprob)
                sent_len[seq_id] = prompt_len + len(outputs)
            out.append((md.request_id, deltas, md.block_tables, md.do_sample,
                        md.computed_lens, md.token_chunk_size, md.guided_bitmasks))  # fmt: skip
        return dataclasses.replace(request, seq_group_metadata_list=out)

    def forget(self, seq_ids: list[int]) -> None:
        for seq_id in seq_ids:
            self.sent_len.pop(seq_id, None)


class StageRequestCache:
    """Stage side: the sequences and params of running requests, rebuilt from deltas."""

    def __init__(self) -> None:
        self.data: dict[int, SequenceData] = {}
        self.params: dict[int, SamplingParams] = {}
        self.loras: dict[int, object] = {}  # seq_id -> its group's LoRARequest (if any)

    def expand(self, request: ExecuteModelRequest | list) -> ExecuteModelRequest | list:
        """Restore whole groups in place (a list: a round of requests).

        Raises:
            KeyError: a delta for a sequence this stage never saw (naming it).
        """
        if isinstance(request, list):
            return [self.expand(r) for r in request]
        groups = request.seq_group_metadata_list
        for i, md in enumerate(groups):
            if not isinstance(md, tuple):  # sent whole: keep its sequences and params
                for seq_id, data in md.seq_data.items():
                    self.data[seq_id] = data
                    self.params[seq_id] = md.sampling_params
                    if md.lora_request is not None:
                        self.loras[seq_id] = md.lora_request
                continue
            request_id, deltas, tables, do_sample, computed, chunk, masks = md
            seq_data = {}
            for seq_id, (new_ids, cum_lp) in deltas.items():
                data = self.data.get(seq_id)
                if data is None:
                    raise KeyError(f"sequence {seq_id}: a delta arrived before its prefill.")
                data.output_token_ids.extend(new_ids)
                data.cumulative_logprob = cum_lp
                seq_data[seq_id] = data
            first = next(iter(deltas))
            groups[i] = SequenceGroupMetadata(
                request_id, False, seq_data, self.params[first], tables, do_sample, computed,
                chunk, masks, self.loras.get(first),
            )  # fmt: skip
        return request

    def forget(self, seq_ids: list[int]) -> None:
        for seq_id in seq_ids:
            self.data.pop(seq_id, None)
            self.params.pop(seq_id, None)
            self.loras.pop(seq_id, None)
