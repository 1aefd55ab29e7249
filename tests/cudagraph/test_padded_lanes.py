"""A padded lane (a batch row with no request) never writes a block a request owns.

Guards docs/design.md "Padded lanes": padded rows carry slot -1, which must be redirected to the
per-VE scratch slot; indexing the cache with -1 directly would wrap to the last slot.
"""

import pytest

from vllm.sampling_params import SamplingParams
from vllm.sequence import SequenceData, SequenceGroupMetadata


def _worker(model, num_blocks):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.worker.worker import Worker

    cfg = EngineArgs(
        model=model, device="cpu", num_gpu_blocks_override=num_blocks
    ).create_engine_config()
    w = Worker(cfg)
    w.init_device()
    w.load_model()
    n = w.determine_num_available_blocks()
    assert n == num_blocks
    w.initialize_cache(n)
    return w


@pytest.mark.forked
def test_padded_write_leaves_last_block_unchanged(tiny_llama_dir):
    num_blocks = 4
    w = _worker(tiny_llama_dir, num_blocks)
    last = num_blocks - 1  # the allocator's last block, right before the scratch block
    params = SamplingParams(temperature=0, max_tokens=4)
    data = SequenceData(list(range(10, 15)))  # 5 tokens in block `last`
    prefill = SequenceGroupMetadata("r", True, {0: data}, params, {0: [last]})
    from vllm.sequence import ExecuteModelRequest

    out = w.execute_model(ExecuteModelRequest([prefill]))
    data.append_token_id(out.outputs[0].samples[0].output_token, 0.0)
    caches = w.kv_caches[0]
    before = [c[:, last].clone() for c in caches]  # [2, block_size, kv_heads, head]
    scratch_before = [c[:, num_blocks].clone() for c in caches]
    w.model_runner.pad_eager_batches = True  # pad the 1-row decode batch below
    decode = SequenceGroupMetadata("r", False, {0: data}, params, {0: [last]})
    second = SequenceGroupMetadata("s", False, {1: SequenceData([7, 8, 9])}, params, {1: [0]})
    w.execute_model(ExecuteModelRequest([decode, second]))  # 2 rows -> no pad; then 3 rows
    third = SequenceGroupMetadata("t", False, {2: SequenceData([5, 6])}, params, {2: [1]})
    batch = w.model_runner.prepare_model_input(
        [decode, second, third], 0, w.cache_engines[0].scratch_slot
    )
    assert batch.batch_size == 4 and batch.num_real_rows == 3  # one padded lane
    w.model_runner.execute_model(batch, caches)
    pos = data.get_len() - 1  # the only slot of block `last` a real row wrote: position 5
    for b, c in zip(before, caches):
        changed = (c[:, last] != b).any(dim=-1).any(dim=-1).any(dim=0)  # [block_size]
        assert changed.nonzero().flatten().tolist() == [pos], "a padded lane wrote a real block"
    wrote_scratch = any((c[:, num_blocks] != s).any() for s, c in zip(scratch_before, caches))
    assert wrote_scratch, "the padded lane did not write the scratch block"
