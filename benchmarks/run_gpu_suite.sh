#!/usr/bin/env bash
# The GPU suite: the GPU tests and the benchmarks behind README.md's H200 table.
#
# Run from anywhere on a CUDA host where the package is installed (README "GPU host"):
#
#   benchmarks/run_gpu_suite.sh [--out DIR] COMMAND
#
# COMMAND (default: all):
#   env           the conditions only (env.json: date, GPU, driver, versions, git commit)
#   tests         every test marked `gpu` or `multi_gpu(n)`, in four groups: CUDA graphs
#                 (test_cuda_graphs_gpu.py), speculative decoding (test_spec_gpu.py), the
#                 other single-GPU tests (kernels, backends, samplers) and the multi-GPU
#                 tests (pipeline parallelism, Ray; they skip with fewer than 2 GPUs)
#   bench core    SmolLM2 bf16 at batch 1 / 8 / 64 x 128 tokens: CUDA graphs vs
#                 --enforce-eager vs transformers (--hf-peer), and the plot; the
#                 Llama-3.1-8B shape at batch 1 (dummy weights: time per token and the
#                 bandwidth floor ratio); the Qwen2.5-0.5B shape on nano-vllm's workload
#   bench spec    batch-1 speculative decoding: none vs [ngram] vs a draft model (k = 4)
#   bench serve   `vllm serve` SmolLM2 + benchmark_serving (256 requests at concurrency 64,
#                 then 64 requests at 16 req/s)
#   bench apc     prefix caching off vs on: multi-turn chat TTFT through `vllm serve` (64
#                 conversations x 4 turns, 1,024-token system prompt) and nano-vllm's
#                 workload at a 0% hit rate (Qwen2.5-0.5B shape); apc.jsonl
#   bench structured  output tokens/s at batch 1 and 32, a JSON schema vs unconstrained
#   bench pp      PP=2 vs PP=1 (Qwen2.5-1.5B and Llama-3.1-8B shapes; needs 2 GPUs)
#   bench all     core, spec, serve, apc, structured, and pp when 2 GPUs are visible
#   all           env, tests, bench all
#
# Output, in DIR (--out, else $OUT, else gpu-suite-<UTC date and time>/ in the repository
# root, which git ignores):
#   env.json                  the conditions of the run
#   tests_<group>.log         pytest's output per test group
#   results.jsonl             one line per test group: {"suite": "gpu_tests", "group", "summary", "exit"}
#   <bench>.jsonl, <bench>.log   each benchmark's JSON lines and full output
#                             (sweep, llama8b, nano, spec, serving, pp); throughput_vs_batch.png
# The exit status is non-zero when any step failed; every step runs regardless.
# Environment: PYTHON (default python), PORT for `bench serve` (default 8011); pick GPUs
# with CUDA_VISIBLE_DEVICES as usual.
set -uo pipefail

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }

out=${OUT:-}
args=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --out) out=${2:?--out needs a directory}; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) args+=("$1"); shift ;;
    esac
done
set -- "${args[@]:-all}"
case "$1 ${2:-all}" in
    "env all" | "tests all" | "all all" | "bench core" | "bench spec" | "bench serve" | \
        "bench apc" | "bench structured" | "bench pp" | "bench all") ;;
    *) usage >&2; exit 2 ;;
esac

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
O=${out:-$ROOT/gpu-suite-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$O" || exit 2
O=$(cd "$O" && pwd)
PY=${PYTHON:-python}
PORT=${PORT:-8011}
B=benchmarks
M="--num-scheduler-steps 8"  # multi-step decoding, as in the README table
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
status=0

step() {  # step NAME CMD...: run CMD, its output also into $O/NAME.log; remember a failure
    local name=$1
    shift
    echo "=== $name: $*" | tee -a "$O/$name.log"
    "$@" 2>&1 | tee -a "$O/$name.log"
    local rc=${PIPESTATUS[0]}
    if [[ $rc -ne 0 ]]; then
        echo "=== $name failed (exit $rc)" | tee -a "$O/$name.log"
        status=1
    fi
    return "$rc"
}

num_gpus() {
    nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l
}

write_env() {
    "$PY" - "$O/env.json" <<'PY'
import datetime, json, platform, subprocess, sys
from importlib import metadata

def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None

def run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
    except Exception:
        return None

import torch
info = {
    "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "gpus": run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                 "--format=csv,noheader"]),
    "python": platform.python_version(),
    "torch": torch.__version__,
    "cuda": torch.version.cuda,
    "flashinfer": version("flashinfer-python"),
    "triton": version("triton"),
    "transformers": version("transformers"),
    "ray": version("ray"),
    "git_commit": run(["git", "rev-parse", "HEAD"]),
}
json.dump(info, open(sys.argv[1], "w"), indent=1)
print(json.dumps(info))
PY
}

run_tests() {
    local T=("$PY" -m pytest --forked -q -p no:cacheprovider -rs)
    local graphs spec
    graphs=$(find tests -name test_cuda_graphs_gpu.py | head -n 1)
    spec=$(find tests -name test_spec_gpu.py | head -n 1)
    test_group graphs "${T[@]}" "$graphs"
    test_group spec "${T[@]}" "$spec"
    test_group other "${T[@]}" tests -m "gpu and not multi_gpu" \
        --ignore="$graphs" --ignore="$spec"
    test_group multi_gpu "${T[@]}" tests -m multi_gpu
}

test_group() {  # test_group GROUP PYTEST_CMD...: log, then one summary line in results.jsonl
    local group=$1
    shift
    step "tests_$group" "$@"
    local rc=$?
    local summary
    summary=$(grep -E "(passed|failed|skipped|error|deselected|no tests ran).* in [0-9.]+s" \
        "$O/tests_$group.log" | tail -n 1 | tr -d '=' | sed 's/^ *//;s/ *$//')
    "$PY" -c 'import json, sys; print(json.dumps({"suite": "gpu_tests", "group": sys.argv[1],
        "summary": sys.argv[2], "exit": int(sys.argv[3])}))' "$group" "$summary" "$rc" \
        >> "$O/results.jsonl"
}

bench_core() {
    step sweep "$PY" $B/benchmark_throughput.py --dtype bfloat16 --batch-sizes 1,8,64 \
        --input-len 128 --output-len 128 --num-iters 1 --hf-peer --no-tqdm $M \
        --output-json "$O/sweep.jsonl"
    step plot "$PY" $B/plot_throughput.py "$O/sweep.jsonl" --out "$O/throughput_vs_batch.png"
    step llama8b "$PY" $B/benchmark_latency.py --model $B/configs/llama-3.1-8b \
        --load-format dummy --skip-tokenizer-init --max-model-len 2048 --dtype bfloat16 \
        --batch-size 1 --input-len 128 --output-len 128 --max-num-seqs 8 --num-iters 2 \
        --num-iters-warmup 1 --no-tqdm $M --output-json "$O/llama8b.jsonl"
    step nano "$PY" $B/benchmark_throughput.py --model $B/configs/qwen2.5-0.5b \
        --load-format dummy --skip-tokenizer-init --max-model-len 4096 --dtype bfloat16 \
        --dataset random-range --num-prompts 256 --no-tqdm $M --output-json "$O/nano.jsonl"
}

bench_spec() {
    step spec "$PY" $B/benchmark_spec_decode.py --dtype bfloat16 --num-speculative-tokens 4 \
        --output-json "$O/spec.jsonl"
}

bench_serve() {
    "$PY" -m vllm.entrypoints.cli serve --dtype bfloat16 --port "$PORT" --max-model-len 2048 \
        --gpu-memory-utilization 0.3 --disable-log-requests > "$O/serve.log" 2>&1 &
    local pid=$!
    if ! "$PY" - "$PORT" "$pid" <<'PY'
import os, sys, time, urllib.request
port, pid = sys.argv[1], int(sys.argv[2])
for _ in range(600):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
        sys.exit(0)
    except Exception:
        try:
            os.kill(pid, 0)
        except OSError:
            sys.exit("vllm serve exited during start-up (see serve.log)")
        time.sleep(1)
sys.exit("vllm serve did not answer /health within 600 s (see serve.log)")
PY
    then
        status=1
        kill -INT "$pid" 2>/dev/null
        wait "$pid"
        return 1
    fi
    local url=http://127.0.0.1:$PORT
    step serving "$PY" $B/benchmark_serving.py --base-url "$url" --num-prompts 256 \
        --request-rate inf --max-concurrency 64 --input-len 128 --output-len 128
    step serving "$PY" $B/benchmark_serving.py --base-url "$url" --num-prompts 64 \
        --request-rate 16 --input-len 128 --output-len 128
    sed -n 's/^RESULT_JSON //p' "$O/serving.log" > "$O/serving.jsonl"
    kill -INT "$pid" 2>/dev/null
    wait "$pid"
}

bench_apc() {
    step apc "$PY" $B/benchmark_prefix_caching.py --device cuda \
        --offline-model $B/configs/qwen2.5-0.5b --offline-load-format dummy \
        --server-args "--gpu-memory-utilization 0.3" --output-json "$O/apc.jsonl"
}

bench_structured() {
    step structured "$PY" $B/benchmark_structured_output.py --dtype bfloat16 \
        --batch-sizes 1,32 --output-json "$O/structured.jsonl"
}

bench_pp() {
    if [[ $(num_gpus) -lt 2 ]]; then
        echo "bench pp: needs 2 GPUs, found $(num_gpus); skipped" | tee -a "$O/pp.log"
        return 0
    fi
    for m in qwen2.5-1.5b llama-3.1-8b; do
        step pp "$PY" $B/benchmark_pipeline_parallel.py --model $B/configs/$m \
            --output-json "$O/pp.jsonl"
    done
}

bench() {
    case ${1:-all} in
        core) bench_core ;;
        spec) bench_spec ;;
        serve) bench_serve ;;
        apc) bench_apc ;;
        structured) bench_structured ;;
        pp) bench_pp ;;
        all) bench_core; bench_spec; bench_serve; bench_apc; bench_structured; bench_pp ;;
        esac
}

echo "run_gpu_suite: output in $O"
write_env || status=1
case $1 in
    env) ;;
    tests) run_tests ;;
    bench) bench "${2:-all}" ;;
    all) run_tests; bench all ;;
esac
echo "run_gpu_suite: done (exit $status); results in $O"
exit $status
