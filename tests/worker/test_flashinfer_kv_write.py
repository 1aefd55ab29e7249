"""FLASHINFER's cache write (no FlashInfer needed): the flat key/value rows computed on the
host put every token where the NHD layout [blocks + 1, 2, block_size, kv_heads, head_size]
says, and padded lanes (-1) land in the scratch slot only."""

import torch

from vllm.attention.backends.flashinfer.paged_cache import slot_rows_host, write_kv


def test_write_kv_matches_block_offset_indexing():
    torch.manual_seed(0)
    blocks, bs, h_kv, d = 5, 4, 3, 8
    scratch = blocks * bs  # first slot of the scratch block (index num_blocks)
    slots = [0, 3, 4, 9, 19, -1, -1]
    key = torch.randn(len(slots), h_kv, d)
    value = torch.randn(len(slots), h_kv, d)
    cache = torch.zeros(blocks + 1, 2, bs, h_kv, d)
    rows = slot_rows_host(slots, scratch, bs)
    assert rows[0].tolist() == [0, 3, 4, 9, 19, scratch, scratch]
    write_kv(cache, key, value, rows[1:])
    ref = torch.zeros_like(cache)
    for i, s in enumerate(slots[:5]):
        ref[s // bs, 0, s % bs] = key[i]
        ref[s // bs, 1, s % bs] = value[i]
    assert torch.equal(cache[:blocks], ref[:blocks])  # real slots exact, nothing else touched
    assert cache[blocks, :, 1:].abs().sum() == 0  # padded lanes wrote the scratch slot only
    assert cache[blocks, 0, 0].abs().sum() > 0 and cache[blocks, 1, 0].abs().sum() > 0
