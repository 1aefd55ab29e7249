"""Decode steps sent to stage processes as deltas (vllm/worker/request_delta.py): what a
stage rebuilds equals what the driver scheduled, step after step, and the pickled decode
request no longer carries the prompt or the params."""

import pickle

import pytest

from vllm.sampling_params import SamplingParams
from vllm.sequence import ExecuteModelRequest, SequenceData, SequenceGroupMetadata
from vllm.worker.request_delta import DriverRequestEncoder, StageRequestCache


def _group(rid: str, seq_id: int, data: SequenceData, is_prompt: bool, params):
    return SequenceGroupMetadata(rid, is_prompt, {seq_id: data}, params, {seq_id: [seq_id]})


def _snapshot(req: ExecuteModelRequest):
    return [
        (md.request_id, md.is_prompt, {s: (d.get_token_ids(), d.cumulative_logprob)
         for s, d in md.seq_data.items()}, md.sampling_params.max_tokens, md.block_tables)
        for md in req.seq_group_metadata_list
    ]  # fmt: skip


def test_stage_rebuilds_every_step_and_forgets():
    params = [SamplingParams(max_tokens=10 + i, seed=i) for i in range(3)]
    datas = [SequenceData(list(range(100 + 50 * i)), []) for i in range(3)]
    enc, cache = DriverRequestEncoder(), StageRequestCache()

    def step(is_prompt: bool, ids: list[int]):
        req = ExecuteModelRequest(
            [_group(f"r{i}", i, datas[i], is_prompt, params[i]) for i in ids], 0
        )
        wire = pickle.dumps(enc.encode(req))
        got = cache.expand(pickle.loads(wire))
        assert _snapshot(got) == _snapshot(req)
        return len(wire)

    step(True, [0, 1, 2])
    sizes = []
    for t in range(5):
        for i, d in enumerate(datas):
            d.append_token_id(1000 + 10 * t + i, -0.5 * t)
        sizes.append(step(False, [0, 1, 2]))
    # prompts of 100-200 tokens are never resent: each decode message stays the same size
    assert max(sizes) - min(sizes) < 16, sizes
    full = len(pickle.dumps(ExecuteModelRequest(
        [_group(f"r{i}", i, datas[i], False, params[i]) for i in range(3)], 0)))  # fmt: skip
    assert max(sizes) < full / 3, (sizes, full)
    # a preempted sequence comes back as a prefill: sent whole again, then deltas
    datas[1].append_token_id(7, 0.0)
    step(True, [1])
    datas[1].append_token_id(8, 0.0)
    step(False, [1])
    enc.forget([0])
    cache.forget([0])
    assert 0 not in cache.data and 0 not in enc.sent_len
    datas[0].append_token_id(9, 0.0)
    step(False, [0])  # unknown to the encoder now: sent whole, so the stage can rebuild it


def test_delta_without_prefill_names_the_sequence():
    enc = DriverRequestEncoder()
    data = SequenceData([1, 2, 3], [])
    params = SamplingParams(max_tokens=4)
    enc.encode(ExecuteModelRequest([_group("r", 5, data, True, params)], 0))
    data.append_token_id(4, 0.0)
    wire = enc.encode(ExecuteModelRequest([_group("r", 5, data, False, params)], 0))
    with pytest.raises(KeyError, match="sequence 5"):
        StageRequestCache().expand(wire)
