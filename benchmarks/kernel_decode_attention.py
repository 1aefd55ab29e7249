"""One layer's decode attention: FlashInfer's path against the Triton small-decode kernel
(vllm/kernels/decode_attention.py), per shape, batch and context.

- ``flashinfer``: what FLASHINFER runs per layer in a replayed graph (the Triton rotary
  kernel with the cache write, FlashInfer's decode, and its merge when it splits the KV),
  planned outside the graph as the engine plans it;
- ``triton``: ``paged_decode_attention`` (RoPE, cache write and split-KV attention in one
  launch), at its default tile and, with ``--tiles``, at each tile given (registers and
  splits trade against each other: the default tile of the SmolLM2 shape compiles to 255
  registers a thread for sm_90, a tile of 32 to 137), and with ``--splits`` at each
  split cap given (the default is ``split_cap(batch, kv_heads)``).

Timing: one CUDA graph runs the op over ``--layers`` distinct caches (so the context comes
from HBM), replayed ``--iters`` times; microseconds per op include the gaps between
kernels (bench_common.graph_time_us). Every Triton variant is checked against FlashInfer's
output first (bf16, 2e-2). Prints conditions and one JSON line per (shape, batch,
context). GPU only, FlashInfer installed. Example::

    python benchmarks/kernel_decode_attention.py --shapes smollm2,qwen2.5-0.5b \\
        --batch-sizes 1,4,8 --contexts 64,256,1024,4096 --tiles 16,32,64
"""

from __future__ import annotations

import json

import torch
from bench_common import device_name, graph_time_us, print_conditions

from vllm.utils import FlexibleArgumentParser

# (query heads, kv heads, head_dim) of the shipped benchmark shapes
SHAPES = {"smollm2": (9, 3, 64), "qwen2.5-0.5b": (14, 2, 64), "llama-3.1-8b": (32, 8, 128)}
BLOCK = 16


class _Layer:
    def __init__(self, h, h_kv, d):
        self.num_heads, self.num_kv_heads, self.head_size, self.scale = h, h_kv, d, d**-0.5


def _case(shape: str, batch: int, ctx: int, layers: int, args) -> dict:
    from vllm.attention.backends.abstract import AttentionSpec, ForwardMode, StepInputs
    from vllm.attention.backends.flashinfer import FlashInferBackend
    from vllm.attention.backends.flashinfer.metadata import FlashInferImpl
    from vllm.kernels.decode_attention import (
        MAX_SPLITS,
        DecodeWorkspace,
        decode_tiles,
        paged_decode_attention,
        split_cap,
    )
    from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding

    h, h_kv, d = SHAPES[shape]
    dev, dt = torch.device("cuda"), torch.bfloat16
    per_row = -(-ctx // BLOCK)
    blocks = batch * per_row
    # small_decode_max_rows=0: FlashInfer's own decode
    spec = AttentionSpec(h, h_kv, d, BLOCK, dt, dev, max(ctx, 1024), small_decode_max_rows=0)
    backend = FlashInferBackend(spec)
    scratch_slot = blocks * BLOCK
    state = backend.make_graph_state(scratch_slot)
    state.allocate(batch)
    md = state.metadata_for_capture(batch)
    tables = [list(range(r * per_row, (r + 1) * per_row)) for r in range(batch)]
    lens = [ctx] * batch
    slots = [t[(ctx - 1) // BLOCK] * BLOCK + (ctx - 1) % BLOCK for t in tables]
    state.prepare_replay(batch, StepInputs(ForwardMode.DECODE, lens, [1] * batch, tables,
                                           slots, batch), md)  # fmt: skip
    caches = [
        torch.randn(blocks + 1, 2, BLOCK, h_kv, d, dtype=dt, device=dev) for _ in range(layers)
    ]
    qkv = torch.randn(batch, (h + 2 * h_kv) * d, dtype=dt, device=dev)
    q, k, v = qkv.split([h * d, h_kv * d, h_kv * d], dim=-1)
    pos = torch.full((batch,), ctx - 1, dtype=torch.long, device=dev)
    rope = RotaryEmbedding(d, d, 131072, {"rope_theta": 500000.0, "rope_type": "default"}).to(dev)
    layer = _Layer(h, h_kv, d)
    bt = torch.tensor(tables, dtype=torch.int32, device=dev)  # [batch, per_row]
    sl = torch.tensor(lens, dtype=torch.int32, device=dev)
    # room for any cap the sweep asks for
    ws = DecodeWorkspace(batch, h, h_kv, d, dev, MAX_SPLITS if args.splits else None)

    def flashinfer(i):  # the rotary kernel rotates in place: rotate copies, as layers do
        return FlashInferImpl.forward(layer, q.clone(), k.clone(), v, caches[i], md, pos, rope)

    def triton(i, tile=None, splits=None):
        return paged_decode_attention(q, k, v, pos, rope.cos_sin_cache, caches[i], bt, sl, ws,
                                      h, layer.scale, blocks, ctx, tile, splits)  # fmt: skip

    ref = flashinfer(0).float()
    rec = {"bench": "kernel_decode_attention", "shape": shape, "batch": batch, "context": ctx,
           "flashinfer_us": round(graph_time_us(flashinfer, layers, args.iters), 2)}  # fmt: skip
    cap = split_cap(batch, h_kv)
    variants = [(None, None)] + [(t, None) for t in args.tiles]
    variants += [(None, s) for s in args.splits]
    for tile, splits in variants:
        got = triton(0, tile, splits).float()
        err = ((got - ref).norm() / ref.norm()).item()
        if err > 2e-2:
            raise AssertionError(
                f"{shape} b{batch} ctx{ctx} tile {tile} splits {splits}: rel err {err:.3g}"
            )
        us = graph_time_us(lambda i, t=tile, s=splits: triton(i, t, s), layers, args.iters)
        key = f"triton_tile{tile}_us" if tile else f"triton_splits{splits}_us" if splits else None
        rec[key or "triton_us"] = round(us, 2)
    long, short = decode_tiles(h // h_kv, d)  # the default: short up to cap * short
    rec["triton_default_tile"] = short if ctx <= cap * short else long
    rec["triton_default_splits"] = cap
    return rec


def main() -> None:
    p = FlexibleArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="smollm2,qwen2.5-0.5b,llama-3.1-8b")
    p.add_argument("--batch-sizes", default="1,4,8")
    p.add_argument("--contexts", default="64,256,1024,4096")
    p.add_argument("--tiles", default="", help="Extra Triton tiles to time, e.g. 16,32,64.")
    p.add_argument("--splits", default="", help="Split caps to time too, e.g. 1,2,4,8.")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--iters", type=int, default=50)
    args = p.parse_args()
    args.tiles = [int(t) for t in args.tiles.split(",") if t]
    args.splits = [int(s) for s in args.splits.split(",") if s]
    print_conditions(
        "kernel_decode_attention",
        {"gpu": device_name("cuda"), "dtype": "bfloat16", "block_size": BLOCK,
         "layers": args.layers, "iters": args.iters, "warmup": "3 replays"},
    )  # fmt: skip
    for shape in args.shapes.split(","):
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            for ctx in (int(c) for c in args.contexts.split(",")):
                print(json.dumps(_case(shape, batch, ctx, args.layers, args)), flush=True)


if __name__ == "__main__":
    main()
