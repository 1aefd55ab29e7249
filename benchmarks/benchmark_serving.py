"""Serving benchmark against a running `vllm serve` (OpenAI /v1/completions, streaming).

Sends ``--num-prompts`` requests of ``--input-len`` random-word prompts (``--dataset-name
random``, upstream's: prompts of exactly ``--random-input-len`` random token ids in
[100, 10000), sent as token ids) asking for exactly ``--output-len`` (``--random-output-len``)
tokens (ignore_eos), arriving as a Poisson process of ``--request-rate``
requests/s (inf: all at once), with at most ``--max-concurrency`` in flight. Reports:

- TTFT: time from sending a request to its first streamed token.
- TPOT: (end - first token) / (output tokens - 1), per request.
- ITL: gaps between consecutive streamed chunks.
- output tokens/s = all completion tokens / wall-clock seconds of the run.

Prints the conditions, a table, then one JSON line (prefix ``RESULT_JSON ``).

    vllm serve --device cpu --max-model-len 512 --port 8000 &
    python benchmarks/benchmark_serving.py --base-url http://127.0.0.1:8000 \\
        --num-prompts 32 --request-rate inf --max-concurrency 8 --input-len 32 --output-len 16
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time

import httpx
from bench_common import percentile
from stream_clients import StreamClients

from vllm.utils import FlexibleArgumentParser

WORDS = "the of and to in is was for on that with as by at from his her it an are were".split()


def percentiles(xs: list[float], ps=(50, 90, 99)) -> dict[str, float | None]:
    """Nearest-rank percentiles of ``xs`` (milliseconds in the report), plus the mean;
    every value None when ``xs`` is empty (JSON null, not NaN)."""
    if not xs:
        return {"mean": None, **{f"p{p}": None for p in ps}}
    out = {"mean": sum(xs) / len(xs)}
    for p in ps:
        out[f"p{p}"] = percentile(xs, p)
    return out


async def one_request(client, url, model, prompt, output_len, key) -> dict:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    start = time.perf_counter()
    stamps: list[float] = []
    tokens = prompt_tokens = 0
    try:
        async with client.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                return {"ok": False, "error": (await r.aread()).decode()[:200]}
            async for line in r.aiter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                data = json.loads(line[5:])
                if "error" in data:
                    return {"ok": False, "error": data["error"]["message"]}
                if data.get("choices"):
                    stamps.append(time.perf_counter())
                if data.get("usage"):
                    tokens = data["usage"]["completion_tokens"]
                    prompt_tokens = data["usage"]["prompt_tokens"]
    except httpx.HTTPError as e:  # refused, reset or timed out: a failed request
        return {"ok": False, "error": f"{type(e).__name__}: {e}"[:200]}
    end = time.perf_counter()
    if not stamps:
        return {"ok": False, "error": "no tokens"}
    ttft = stamps[0] - start
    tpot = (end - stamps[0]) / (tokens - 1) if tokens > 1 else 0.0
    itl = [b - a for a, b in zip(stamps, stamps[1:])]
    return {
        "ok": True,
        "ttft": ttft,
        "tpot": tpot,
        "itl": itl,
        "tokens": tokens,
        "prompt_tokens": prompt_tokens,
        "e2e": end - start,
    }


async def run(args) -> dict:
    rng = random.Random(args.seed)
    base = args.base_url.rstrip("/")
    concurrency = args.max_concurrency or args.num_prompts
    async with StreamClients(concurrency) as pool:  # a connection per stream: see there
        model = args.model
        if model is None:
            headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
            async with pool.client() as c:
                try:
                    r = await c.get(f"{base}/v1/models", headers=headers)
                    model = r.json()["data"][0]["id"]
                except (httpx.HTTPError, ValueError, KeyError, IndexError) as e:
                    raise SystemExit(
                        f"error: no model from {base}/v1/models ({type(e).__name__}: {e}); "
                        "is the server up? (or pass --model)"
                    ) from None
        if args.dataset_name == "random":
            prompts = [
                [rng.randrange(100, 10000) for _ in range(args.input_len)]
                for _ in range(args.num_prompts)
            ]
        else:
            prompts = [
                " ".join(rng.choice(WORDS) for _ in range(args.input_len))
                for _ in range(args.num_prompts)
            ]

        async def limited(p):
            async with pool.client() as c:  # waits while all `concurrency` clients are out
                return await one_request(
                    c, f"{base}/v1/completions", model, p, args.output_len, args.api_key
                )

        tasks = []
        start = time.perf_counter()
        for p in prompts:
            tasks.append(asyncio.create_task(limited(p)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    ok = [r for r in results if r["ok"]]
    out_tokens = sum(r["tokens"] for r in ok)
    ms = lambda d: {k: None if v is None else round(v * 1000, 2) for k, v in d.items()}  # noqa: E731
    return {
        "model": model,
        "num_prompts": args.num_prompts,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "request_rate": "inf" if args.request_rate == float("inf") else args.request_rate,
        "max_concurrency": args.max_concurrency,
        "dataset": args.dataset_name,
        (
            "input_len_tokens" if args.dataset_name == "random" else "input_len_words"
        ): args.input_len,
        "output_len": args.output_len,
        "duration_s": round(duration, 3),
        "total_input_tokens": sum(r["prompt_tokens"] for r in ok),
        "total_output_tokens": out_tokens,
        "request_throughput": round(len(ok) / duration, 3),
        "output_tokens_per_s": round(out_tokens / duration, 2),
        "ttft_ms": ms(percentiles([r["ttft"] for r in ok])),
        "tpot_ms": ms(percentiles([r["tpot"] for r in ok])),
        "itl_ms": ms(percentiles([x for r in ok for x in r["itl"]])),
        "e2e_ms": ms(percentiles([r["e2e"] for r in ok])),
        "errors": sorted({r["error"] for r in results if not r["ok"]})[:3],
    }


def _bad_value(args) -> str | None:
    """Why a flag's value cannot run (a count below 1, a rate not above 0), else None."""
    for name in ("num_prompts", "input_len", "output_len", "max_concurrency"):
        value = getattr(args, name)
        if value is not None and value < 1:
            return f"--{name.replace('_', '-')} must be at least 1, got {value}."
    if not args.request_rate > 0:
        return f"--request-rate must be above 0 (inf: all at once), got {args.request_rate}."
    return None


def main() -> int:
    """Run, print the summary and the RESULT_JSON line; returns 2 for a flag value that
    cannot run (one ``error:`` line), 1 when no request completed (nothing was
    measured), else 0."""
    ap = FlexibleArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--backend", choices=("vllm", "openai"), default="vllm",
        help="upstream's; both stream /v1/completions (the only API this client drives)",
    )  # fmt: skip
    ap.add_argument("--base-url", default=None, help="default: http://HOST:PORT")
    ap.add_argument("--host", default="127.0.0.1", help="upstream's: with --port, the server")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--model", default=None, help="default: the first of /v1/models")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s")
    ap.add_argument("--max-concurrency", type=int, default=None)
    ap.add_argument(
        "--dataset-name", choices=("words", "random"), default="words",
        help="words: random-word prompts; random (upstream's): random token-id prompts",
    )  # fmt: skip
    ap.add_argument(
        "--input-len", "--random-input-len", type=int, default=32,
        help="words (or, with --dataset-name random, tokens) per prompt",
    )  # fmt: skip
    ap.add_argument(
        "--output-len", "--random-output-len", type=int, default=16, help="tokens per request"
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    why = _bad_value(args)
    if why is not None:  # one line and exit 2, as `vllm serve` refuses a flag
        print(f"error: {why}", file=sys.stderr)
        return 2
    args.base_url = args.base_url or f"http://{args.host}:{args.port}"
    print(
        f"benchmark_serving: {args.base_url} num_prompts={args.num_prompts} "
        f"request_rate={args.request_rate} max_concurrency={args.max_concurrency} "
        f"input_len={args.input_len} {'tokens' if args.dataset_name == 'random' else 'words'} "
        f"output_len={args.output_len} tokens (ignore_eos)"
    )
    res = asyncio.run(run(args))
    print(f"completed {res['completed']}/{res['num_prompts']} in {res['duration_s']} s")
    print(f"output tokens/s {res['output_tokens_per_s']}  requests/s {res['request_throughput']}")
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        d = {k: float("nan") if v is None else v for k, v in res[name].items()}
        print(f"{name:8s} mean {d['mean']:9.2f}  p50 {d['p50']:9.2f}  p90 {d['p90']:9.2f}  "
              f"p99 {d['p99']:9.2f}")  # fmt: skip
    print("RESULT_JSON " + json.dumps(res))
    if not res["completed"]:
        print(f"error: no request completed; first errors: {res['errors']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
