"""A pipeline's last stage replies with packed rows (vllm/worker/packed_output.py): what the
engine unpacks equals the SamplerOutput the stage would have built, and the pickled reply
is one array, not an object per token."""

import pickle

import torch

from vllm.model_executor.layers.sampler import sampler_output
from vllm.model_executor.sampling_metadata import SamplingMetadata, SeqGroupRows
from vllm.sampling_params import SamplingParams
from vllm.worker.packed_output import PackedSamples, unpack_outputs


def _metadata() -> SamplingMetadata:
    """Three groups: n = 2 with 2 logprobs, a chunk that samples nothing, n = 1 plain."""
    groups = [
        SeqGroupRows([7, 8], SamplingParams(n=2, logprobs=2), [0, 1]),
        SeqGroupRows([9], SamplingParams(), [], do_sample=False),
        SeqGroupRows([11], SamplingParams(), [2]),
    ]
    z = torch.zeros(3, dtype=torch.long)
    return SamplingMetadata(groups, z, z, all_greedy=True, max_logprobs=2)


def _rows(step: int) -> torch.Tensor:
    """[3 samples, 3 + 2k] float64 rows (k = 2): id, logprob, rank, top-2 lps, top-2 ids."""
    ids = [10 + step, 20 + step, 30 + step]
    return torch.tensor(
        [[t, -0.5 * (r + 1), 1, -0.5 * (r + 1), -1.5, t, t + 1] for r, t in enumerate(ids)],
        dtype=torch.float64,
    )


def _as_tuples(out):
    return [
        [(s.parent_seq_id, s.output_token, s.logprobs, s.extra_tokens) for s in g.samples]
        for g in out.outputs
    ]


def test_unpacked_reply_equals_the_stage_output_and_is_one_array():
    sm = _metadata()
    steps = [_rows(i) for i in range(3)]  # a multi-step call of 3 passes
    lp = {1: [None, {5: None}]}
    expected = sampler_output(sm, torch.stack(steps).tolist(), 2, lp)
    packed = PackedSamples.from_steps(sm, steps, 2, lp)
    wire = pickle.loads(pickle.dumps(packed))
    got = unpack_outputs(wire)
    assert _as_tuples(got) == _as_tuples(expected)
    assert [g.prompt_logprobs for g in got.outputs] == [None, [None, {5: None}], None]
    assert got.outputs[0].samples[1].extra_tokens[1][0] == 22  # seq 8, third pass
    assert len(got.outputs[0].samples[0].logprobs) == 2  # the token and one more top id
    assert got.outputs[1].samples == []
    # a round's list is unpacked element by element; other payloads pass through
    assert [len(o.outputs) for o in unpack_outputs([packed, packed])] == [3, 3]
    assert unpack_outputs(None) is None
    assert packed.rows.shape == (3, 3, 7)
