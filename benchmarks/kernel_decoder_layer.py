"""One decode token through one decoder layer: the fused persistent kernel
(vllm/model_executor/layers/triton_layer.py) against the same layer as separate kernels
(the four triton_gemv projections and the small-decode attention kernel), per layer.

Timing: one CUDA graph runs ``--layers`` distinct layers (own weights and caches, so weights
come from HBM as in a real step), replayed ``--iters`` times; microseconds per layer
include the gaps between kernels (bench_common.graph_time_us). ``--phase-times`` also runs
the fused kernel once per layer with its TIMING stamps and prints, per phase (A qkv,
barrier, B attention, barrier, C o_proj, barrier, D gate_up, barrier, E down), the mean
over programs and layers of the phase's duration in microseconds. Sweeps ``--nprogs`` (grid
sizes; 0 = one per SM) and ``--block-ns``; ``--gemv-configs`` / ``--tiles`` time the separate
chain with other one-row GEMV tiles (``BLOCK_NxBLOCK_K[xWARPS]``, BLOCK_K 0 = all of K in
one tile) and decode-attention tiles (0 = the default rule). Random weights in the
SmolLM2-135M shape by default. Prints conditions and one JSON line per variant. GPU only. Example::

    python benchmarks/kernel_decoder_layer.py --context 192 --nprogs 0,64 --phase-times
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os

import torch
from bench_common import device_name, graph_time_us, print_conditions

BLOCK = 16
# hidden, intermediate, heads, kv heads, head_dim
SHAPES = {"smollm2": (576, 1536, 9, 3, 64), "qwen2.5-0.5b": (896, 4864, 14, 2, 64)}
PHASES = ("A", "sync1", "B", "sync2", "C", "sync3", "D", "sync4", "E")


def _layers(shape, n, ctx, dt):
    from transformers import LlamaConfig

    from vllm.attention.backends.abstract import ForwardMode
    from vllm.attention.backends.small_decode import SmallDecodeMetadata
    from vllm.attention.triton_decode import DecodeWorkspace
    from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding
    from vllm.model_executor.models.llama import LlamaDecoderLayer

    hid, inter, h, kvh, d = SHAPES[shape]
    cfg = LlamaConfig(
        hidden_size=hid, intermediate_size=inter, num_attention_heads=h,
        num_key_value_heads=kvh, head_dim=d, max_position_embeddings=8192,
    )  # fmt: skip
    rope = RotaryEmbedding(d, d, 8192, {"rope_theta": 10000.0, "rope_type": "default"})
    dev = torch.device("cuda")
    layers, caches = [], []
    nb = -(-ctx // BLOCK)
    for i in range(n):
        layer = LlamaDecoderLayer(cfg, rope, False, False, False, f"model.layers.{i}")
        with torch.no_grad():
            for p in layer.parameters():
                p.copy_(torch.randn(p.shape) * 0.05 + (1.0 if p.dim() == 1 else 0.0))
        layers.append(layer.to(device=dev, dtype=dt))
        caches.append(torch.randn(nb + 1, 2, BLOCK, kvh, d, device=dev, dtype=dt))
    lens = torch.tensor([ctx], dtype=torch.int32, device=dev)
    md = SmallDecodeMetadata(
        mode=ForwardMode.DECODE, num_rows=1, num_tokens=1, slot_mapping=lens,
        scratch_slot=nb * BLOCK, seq_lens=lens,
        block_tables=torch.arange(nb, dtype=torch.int32, device=dev)[None], block_size=BLOCK,
        max_seq_len=ctx, workspace=DecodeWorkspace(1, h, kvh, d, dev),
    )  # fmt: skip
    pos = torch.tensor([ctx - 1], device=dev)
    return layers, caches, md, pos


@contextlib.contextmanager
def _overrides(gemv: str, tile: int):
    """Within: one-row small-weight GEMVs take the tile ``gemv`` ("BNxBK[xWARPS]", BK 0 =
    next_power_of_2(K), i.e. the whole weight row in one tile) and decode attention the
    context tile ``tile`` for rows of every length (0: unchanged)."""
    import triton

    from vllm.attention import triton_decode
    from vllm.model_executor.layers import triton_gemv

    orig_cfg, orig_tile = triton_gemv.launch_config, triton_decode.tile_tokens
    orig_short = triton_decode.SHORT_TILE

    def cfg(rows, n, k):
        c = orig_cfg(rows, n, k)
        if gemv and rows == 1 and "PERSIST" not in c:
            bn, bk, *w = (int(v) for v in gemv.split("x"))
            c.update(BLOCK_N=bn, BLOCK_K=bk or triton.next_power_of_2(k),
                     num_warps=w[0] if w else c["num_warps"])  # fmt: skip
        return c

    triton_gemv.launch_config = cfg
    if tile:
        triton_decode.tile_tokens = lambda group, head_size: tile
        triton_decode.SHORT_TILE = tile  # every row, whatever its length
    try:
        yield
    finally:
        triton_gemv.launch_config, triton_decode.tile_tokens = orig_cfg, orig_tile
        triton_decode.SHORT_TILE = orig_short


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="smollm2", choices=sorted(SHAPES))
    p.add_argument("--context", type=int, default=192)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--nprogs", default="0", help="Grid sizes, comma-separated; 0 = per SM.")
    p.add_argument("--block-ns", default="8", help="Output features per tile, comma-separated.")
    p.add_argument("--phase-times", action="store_true")
    p.add_argument("--gemv-configs", default="", help="One-row GEMV tiles, e.g. 8x512,4x0x8.")
    p.add_argument("--tiles", default="0", help="Decode-attention tiles; 0 = the default rule.")
    args = p.parse_args()
    from vllm.model_executor.layers import triton_gemv, triton_layer

    dt = torch.bfloat16
    layers, caches, md, pos = _layers(args.shape, args.layers, args.context, dt)
    hid = SHAPES[args.shape][0]
    h = torch.randn(1, hid, device="cuda", dtype=dt)
    r = torch.randn(1, hid, device="cuda", dtype=dt)
    tables = md.paged_decode_tables()
    print_conditions("kernel_decoder_layer conditions", {
        "gpu": device_name("cuda"), "shape": args.shape, "dtype": "bfloat16",
        "context": args.context, "layers": args.layers, "iters": args.iters,
        "warmup": "3 graph replays", "triton_pdl": triton_layer.pdl_enabled(h),
    })  # fmt: skip

    def emit(row):
        print(json.dumps({"bench": "kernel_decoder_layer", "shape": args.shape,
                          "context": args.context, **row}))  # fmt: skip

    os.environ["VLLM_FUSED_DECODER_LAYER"] = "0"
    sep = graph_time_us(
        lambda i: layers[i].forward_small_batch(triton_gemv, pos, h, caches[i], md, r),
        args.layers,
        args.iters,
    )
    emit({"variant": "separate", "us_per_layer": round(sep, 2)})
    for gemv in [c for c in args.gemv_configs.split(",") if c] or [""]:
        for tile in (int(v) for v in args.tiles.split(",")):
            if not gemv and not tile:
                continue
            with _overrides(gemv, tile):
                us = graph_time_us(
                    lambda i: layers[i].forward_small_batch(triton_gemv, pos, h, caches[i], md, r),
                    args.layers, args.iters,
                )  # fmt: skip
            emit({"variant": "separate", "gemv": gemv or "default", "tile": tile or "default",
                  "us_per_layer": round(us, 2)})  # fmt: skip
    for nprog in (int(v) for v in args.nprogs.split(",")):
        for bn in (int(v) for v in args.block_ns.split(",")):
            kw = dict(nprog=nprog or None, block_n=bn)
            us = graph_time_us(
                lambda i, kw=kw: triton_layer.decoder_layer(layers[i], pos, h, r, caches[i],
                                                            tables, **kw),
                args.layers, args.iters,
            )  # fmt: skip
            row = {"variant": "fused", "nprog": nprog, "block_n": bn, "us_per_layer": round(us, 2)}
            if args.phase_times:
                n = nprog or triton_layer.grid_size(layers[0], h, bn)
                t = torch.zeros(args.layers, n, 16, dtype=torch.int64, device="cuda")
                for i in range(args.layers):
                    triton_layer.decoder_layer(layers[i], pos, h, r, caches[i], tables,
                                               timings=t[i], **kw)  # fmt: skip
                torch.cuda.synchronize()
                d = (t[:, :, 1:10] - t[:, :, 0:9]).double() / 1e3  # [layers, n, 9] us
                row["phase_us"] = dict(zip(PHASES, [round(v, 2) for v in d.mean((0, 1)).tolist()]))
                row["phase_max_us"] = dict(
                    zip(PHASES, [round(v, 2) for v in d.amax(1).mean(0).tolist()])
                )
            emit(row)


if __name__ == "__main__":
    main()
