"""The small-batch projection kernels (vllm.kernels.gemv) against what they replace, per shape.

For each projection of a decoder layer (qkv with its RMSNorm, o, gate_up with its RMSNorm
and SiLU-and-mul, down) of the chosen model shapes and each row count, times:

- ``unfused``: the layers the model ran before (Triton RMSNorm, cuBLAS ``F.linear``,
  Triton SiLU-and-mul);
- ``fused``: :mod:`vllm.kernels.gemv` with its default launch config;
- ``lm_head`` (``--lm-head``): the vocabulary projection, cuBLAS vs the plain kernel;
- with ``--sweep``, every config of a grid (``--grid narrow``: the tiled kernel's
  latency-bound tiles; ``rows``: the persistent whole-row kernel of ``vllm.kernels.gemv_rows``
  for bandwidth-bound shapes at one row), printing the best.

First it measures the read ceiling: a Triton kernel that sums a 2 GiB buffer (bytes read /
time), the most a GEMV can reach on this GPU.

Timing: one CUDA graph runs the op over distinct weight copies (at least 240 MB of each
op's weights, at most 30 copies, so they come from HBM as in a model, not from L2),
replayed ``--iters`` times after a warm-up; the time per op is the replay time divided
by layers x iters, which includes the gaps between kernels in a graph. Bandwidth =
weight bytes / time. Prints conditions, a table and one JSON line per (shape, rows). GPU
only. Example::

    python benchmarks/kernel_gemv.py --models smollm2,llama-3.1-8b --rows 1,8 --sweep
    python benchmarks/kernel_gemv.py --models llama-3.1-8b --rows 1 --sweep --grid rows --lm-head
"""

from __future__ import annotations

import itertools
import json
import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from bench_common import graph_time_us

from vllm.utils import FlexibleArgumentParser

# (hidden, intermediate, q heads, kv heads, head_dim, vocab) of the benchmark shapes
SHAPES = {
    "smollm2": (576, 1536, 9, 3, 64, 49152),
    "qwen2.5-0.5b": (896, 4864, 14, 2, 64, 151936),
    "llama-3.1-8b": (4096, 14336, 32, 8, 128, 128256),
}
L2_BYTES = 60e6  # an H200's L2; each op's distinct weights should be several times this


def _copies(nbytes: float, most: int) -> int:
    """Distinct copies of an ``nbytes`` weight that fill 4 L2s: at least 2, at most ``most``."""
    return max(2, min(most, math.ceil(4 * L2_BYTES / nbytes)))


def _layers(shape) -> int:
    """Distinct weight copies of every layer op: enough for the smallest one (bf16), <= 30."""
    hidden, _, hq, hkv, d, _ = shape
    return _copies(min(hidden * hq * d, hidden * (hq + 2 * hkv) * d) * 2, 30)


def _ops(name: str, m: int, shape, layers: int, dtype, lm_head: bool):
    """(op name, n_out, k, weight bytes, unfused fn(i), fused fn(i, cfg))."""
    from vllm.kernels import gemv, norm_rotary

    hidden, inter, hq, hkv, d, vocab = shape
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)

    def w(n, k):
        return [(torch.randn(n, k, device=dev, generator=gen) / k**0.5).to(dtype)
                for _ in range(layers)]  # fmt: skip

    x = torch.randn(m, hidden, device=dev, generator=gen).to(dtype)
    res = torch.randn(m, hidden, device=dev, generator=gen).to(dtype)
    nw = (torch.rand(hidden, device=dev, generator=gen) + 0.5).to(dtype)
    xi = torch.randn(m, inter, device=dev, generator=gen).to(dtype)
    xo = torch.randn(m, hq * d, device=dev, generator=gen).to(dtype)
    qkv_n = (hq + 2 * hkv) * d
    wq, wo, wgu, wd = w(qkv_n, hidden), w(hidden, hq * d), w(2 * inter, hidden), w(hidden, inter)
    eps = 1e-5

    def qkv_unfused(i):
        h, _ = norm_rotary.fused_add_rms_norm(x, res, nw, eps)
        return F.linear(h, wq[i])

    def gu_unfused(i):
        h, _ = norm_rotary.fused_add_rms_norm(x, res, nw, eps)
        return norm_rotary.silu_and_mul(F.linear(h, wgu[i]))

    def launch(xx, r, nn, ww, silu, cfg):
        return gemv._launch(xx, r, nn, eps, ww, None, silu, cfg)[0]

    b = torch.finfo(dtype).bits // 8
    extra = []
    if lm_head:  # one copy per 4 L2s is plenty: it is 57 MB (SmolLM2) to 1 GB (8B)
        wl = [
            (torch.randn(vocab, hidden, device=dev, generator=gen) / hidden**0.5).to(dtype)
            for _ in range(_copies(vocab * hidden * b, layers))
        ]
        extra = [("lm_head", vocab, hidden, vocab * hidden * b,
                  lambda i: F.linear(x, wl[i % len(wl)]),
                  lambda i, c: launch(x, None, None, wl[i % len(wl)], False, c))]  # fmt: skip
    return extra + [
        ("norm+qkv", qkv_n, hidden, qkv_n * hidden * b, qkv_unfused,
         lambda i, c: launch(x, res, nw, wq[i], False, c)),
        ("o", hidden, hq * d, hidden * hq * d * b, lambda i: F.linear(xo, wo[i]),
         lambda i, c: launch(xo, None, None, wo[i], False, c)),
        ("norm+gate_up+silu", inter, hidden, 2 * inter * hidden * b, gu_unfused,
         lambda i, c: launch(x, res, nw, wgu[i], True, c)),
        ("down", hidden, inter, hidden * inter * b, lambda i: F.linear(xi, wd[i]),
         lambda i, c: launch(xi, None, None, wd[i], False, c)),
    ]  # fmt: skip


def _grid(m: int, kind: str, k: int):
    from vllm.kernels.gemv import launch_config

    base = launch_config(m, 0, 0)  # the kernel path (FMA or tl.dot) and its row tile
    use_dot, bm = base["USE_DOT"], base["BLOCK_M"]
    if kind == "rows":  # gemv_rows: whole rows of K, persistent, one row only
        bk = triton.next_power_of_2(k)
        for bn, warps, persist in itertools.product((1, 2, 4, 8), (4, 8, 16), (1, 2, 3, 4)):
            if m == 1 and bn * bk // (32 * warps) <= 64:  # weight elements a thread
                yield dict(PERSIST=persist, BLOCK_N=bn, num_warps=warps)
        return
    for bn, bk, warps, stages in itertools.product((8, 16, 32, 64), (128, 256, 512),
                                                   (4, 8), (2, 4)):  # fmt: skip
        if use_dot and bn < 16:
            continue
        if bm * bn * bk > 16 * 64 * 256:  # register budget of the FMA / dot tile
            continue
        yield dict(USE_DOT=use_dot, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps,
                   num_stages=stages)  # fmt: skip


@triton.jit
def _sum(x_ptr, out_ptr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    v = tl.load(x_ptr + pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK))
    tl.store(out_ptr + pid, tl.sum(v.to(tl.float32), axis=0))


def read_ceiling_gb_s(nbytes: int = 2 << 30, iters: int = 20) -> float:
    """GB/s of a Triton kernel that only reads: each program sums 32 KiB of a 2 GiB bf16
    buffer (16-byte loads, 8 warps) into one float; bytes read / time (CUDA events)."""
    block = 16384
    x = torch.ones(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(x.numel() // block, dtype=torch.float32, device="cuda")
    t = graph_time_us(lambda i: _sum[(out.numel(),)](x, out, BLOCK=block, num_warps=8), 1, iters)
    return nbytes / t / 1e3


def main() -> None:
    p = FlexibleArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="smollm2,llama-3.1-8b")
    p.add_argument("--rows", default="1,2,4,8,16")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--sweep", action="store_true", help="Also time a grid of launch configs.")
    p.add_argument(
        "--grid",
        choices=("narrow", "rows"),
        default="narrow",
        help="The sweep's grid: latency-bound tiles, or the persistent whole-row kernel (one row).",
    )
    p.add_argument("--lm-head", action="store_true", help="Also time the vocabulary projection.")
    p.add_argument("--ops", default="", help="Comma-separated op names to time (default all).")
    args = p.parse_args()
    from vllm.kernels.gemv import launch_config

    dtype = getattr(torch, args.dtype)
    print(f"# GPU {torch.cuda.get_device_name()} torch {torch.__version__} dtype {args.dtype} "
          f"iters {args.iters} (graph replays, after 3 warm-up replays)")  # fmt: skip
    print(json.dumps(dict(bench="read_ceiling", gb_s=round(read_ceiling_gb_s(), 1))))
    for name in args.models.split(","):
        shape = SHAPES[name]
        layers = _layers(shape)
        for m in (int(r) for r in args.rows.split(",")):
            for op, n, k, nbytes, unfused, fused in _ops(name, m, shape, layers, dtype,
                                                         args.lm_head):  # fmt: skip
                if args.ops and op not in args.ops.split(","):
                    continue
                ref, got = unfused(0), fused(0, None)
                err = (ref.float() - got.float()).abs().max().item()
                t_un = graph_time_us(unfused, layers, args.iters)
                cfg = launch_config(m, n, k)
                t_fu = graph_time_us(lambda i, c=cfg, f=fused: f(i, c), layers, args.iters)
                best = (t_fu, cfg)
                if args.sweep:
                    for c in _grid(m, args.grid, k):
                        try:
                            t = graph_time_us(lambda i, c=c, f=fused: f(i, c), layers, args.iters)
                        except Exception as e:  # out of resources for this tile: skip it
                            print(f"#   skip {c}: {type(e).__name__}")
                            continue
                        print(f"#   {n}x{k} {c}: {t:.2f} us {nbytes / t / 1e3:.0f} GB/s")
                        if t < best[0]:
                            best = (t, c)
                row = dict(bench="kernel_gemv", model=name, op=op, rows=m, n=n, k=k, layers=layers,
                           unfused_us=round(t_un, 2),
                           unfused_gb_s=round(nbytes / t_un / 1e3, 1), fused_us=round(t_fu, 2),
                           fused_gb_s=round(nbytes / t_fu / 1e3, 1),
                           best_us=round(best[0], 2), best_gb_s=round(nbytes / best[0] / 1e3, 1),
                           best_config=best[1], max_abs_err=err)  # fmt: skip
                print(json.dumps(row))


if __name__ == "__main__":
    main()
