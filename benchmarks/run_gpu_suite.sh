#!/usr/bin/env bash
# The GPU suite: the GPU tests and the benchmarks behind README.md's H200 table.
#
# Run from anywhere on a CUDA host where the package is installed (README "GPU quick start"):
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
#                 conversations x 4 turns, 1,024-token system prompt) with SmolLM2 and with
#                 the Llama-3.1-8B shape (dummy weights), and nano-vllm's workload at a 0%
#                 hit rate (Qwen2.5-0.5B shape); apc.jsonl
#   bench structured  output tokens/s at batch 1 and 32, a JSON schema vs unconstrained
#   bench pp      PP=2 vs PP=1 (Qwen2.5-1.5B and Llama-3.1-8B shapes; needs 2 GPUs)
#   bench chunked chunked prefill off vs on through `vllm serve`, SmolLM2 and the
#                 Llama-3.1-8B shape (dummy weights): 32 streams decoding while 2,048-token
#                 prompts arrive at 1/s; TPOT p50/p99 and TTFT (the chunked run replays
#                 piecewise graphs, its default); the 8B shape again with its mixed steps
#                 eager (--piecewise-graph-max-tokens 0); chunked.jsonl
#   bench upstream  this engine vs upstream vLLM (staged in $VSITE, default /tmp/vsite, by
#                 ../shared/tools/peer), each in its own processes: benchmark_vs_upstream.py
#                 on SmolLM2 bf16 (converted once from the GGUF into $SMOLLM2_HF, default
#                 /tmp/smollm2-bf16) at batch 1 / 8 / 64, the Qwen2.5-0.5B shape on nano-vllm's
#                 workload and the Llama-3.1-8B shape at batch 1 (dummy weights); then
#                 `vllm serve` of each engine on SmolLM2 bf16 + benchmark_serving (256
#                 requests at concurrency 64, then 64 at 16 req/s). Upstream runs with its
#                 defaults, this engine with the README's flags: 16 scheduler steps offline
#                 (benchmark_vs_upstream.py's default), $M for the server
#   bench upstream-offline, bench upstream-serve   bench upstream in two halves: the
#                 offline workloads and ratios, then the two servers
#   bench all     core, spec, serve, apc, chunked, structured, and pp when 2 GPUs are visible
#                 (not upstream)
#   all           env, tests, bench all
#
# Output, in DIR (--out, else $OUT, else gpu-suite-<UTC date and time>/ in the repository
# root, which git ignores):
#   env.json                  the conditions of the run
#   tests_<group>.log         pytest's output per test group
#   results.jsonl             one line per test group: {"suite": "gpu_tests", "group", "summary", "exit"}
#   <bench>.jsonl, <bench>.log   each benchmark's JSON lines and full output
#                             (sweep, llama8b, nano, spec, serving, pp); throughput_vs_batch.png
#   vs_upstream.jsonl, vs_upstream_ratios.jsonl, serving_vs_upstream.jsonl   bench upstream's
#                             lines (each names its engine) and this engine / upstream ratios
# The exit status is non-zero when any step failed; every step runs regardless.
# Environment: PYTHON (default python), PORT for `bench serve` and `bench upstream` (default
# 8011), VSITE and SMOLLM2_HF for `bench upstream`; pick GPUs with CUDA_VISIBLE_DEVICES.
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
        "bench apc" | "bench pp" | "bench chunked" | "bench structured" | "bench upstream" | \
        "bench upstream-offline" | "bench upstream-serve" | "bench all") ;;
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
M="--num-scheduler-steps 8"  # multi-step decoding, as in the README's core and serving rows
VSITE=${VSITE:-/tmp/vsite}  # upstream vLLM 0.26 (../shared/tools/peer/README.md)
SMOLLM2_HF=${SMOLLM2_HF:-/tmp/smollm2-bf16}
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

wait_health() {  # wait_health PORT PID LOG: until /health answers; fails if PID exits first
    "$PY" - "$1" "$2" "$3" <<'PY'
import os, sys, time, urllib.request
port, pid, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
t0 = time.monotonic()
for _ in range(600):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
        print(f"vllm serve answered /health {time.monotonic() - t0:.0f} s after launch ({log})")
        sys.exit(0)
    except Exception:
        try:
            os.kill(pid, 0)
        except OSError:
            sys.exit(f"vllm serve exited during start-up (see {log})")
        time.sleep(1)
sys.exit(f"vllm serve did not answer /health within 600 s (see {log})")
PY
}

bench_serve() {
    "$PY" -m vllm.entrypoints.cli serve --dtype bfloat16 --port "$PORT" --max-model-len 2048 \
        --gpu-memory-utilization 0.3 --disable-log-requests > "$O/serve.log" 2>&1 &
    local pid=$!
    if ! wait_health "$PORT" "$pid" serve.log; then
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

L8B_SERVED=(--model $B/configs/llama-3.1-8b --device cuda --server-args
    "--load-format dummy --skip-tokenizer-init --gpu-memory-utilization 0.5")

bench_apc() {
    step apc "$PY" $B/benchmark_prefix_caching.py --device cuda \
        --offline-model $B/configs/qwen2.5-0.5b --offline-load-format dummy \
        --server-args "--gpu-memory-utilization 0.3" --output-json "$O/apc.jsonl"
    step apc "$PY" $B/benchmark_prefix_caching.py "${L8B_SERVED[@]}" --skip-offline \
        --output-json "$O/apc.jsonl"
}

bench_chunked() {
    step chunked "$PY" $B/benchmark_chunked_prefill.py --device cuda \
        --server-args "--gpu-memory-utilization 0.3" --output-json "$O/chunked.jsonl"
    step chunked "$PY" $B/benchmark_chunked_prefill.py "${L8B_SERVED[@]}" \
        --output-json "$O/chunked.jsonl"
    step chunked "$PY" $B/benchmark_chunked_prefill.py "${L8B_SERVED[@]}" \
        --chunked-server-args "--piecewise-graph-max-tokens 0" --output-json "$O/chunked.jsonl"
    step chunked "$PY" $B/benchmark_chunked_prefill.py --model $B/configs/llama-3.1-8b \
        --device cuda --server-args "--load-format dummy --skip-tokenizer-init \
        --gpu-memory-utilization 0.5 --num-scheduler-steps 8" --output-json "$O/chunked.jsonl"
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

upstream_py() {  # upstream_py ARGS...: $PY with only upstream vLLM on the path, from $O
    # (upstream's subprocesses would import a checkout's vllm/ from the working directory)
    (cd "$O" && PYTHONPATH=$VSITE exec "$PY" "$@")
}

vs_upstream() {  # vs_upstream ARGS...: benchmark_vs_upstream.py under upstream, then this engine
    local script=$ROOT/$B/benchmark_vs_upstream.py out=$O/vs_upstream.jsonl
    step vs_upstream upstream_py "$script" --expect-engine upstream --output-json "$out" "$@"
    step vs_upstream "$PY" "$script" --expect-engine fork --output-json "$out" "$@"
}

serve_vs_upstream() {  # serve_vs_upstream ENGINE: `vllm serve` SmolLM2 bf16, benchmark_serving
    local engine=$1 log=$O/serve_$1.log pid
    local args=(serve "$SMOLLM2_HF" --port "$PORT" --dtype bfloat16 --max-model-len 2048
        --gpu-memory-utilization 0.3)
    if [[ $engine == upstream ]]; then
        # the server stack (fastapi, uvicorn, ...) may come from the caller's path, after upstream
        (cd "$O" && PYTHONPATH=$VSITE${PYTHONPATH:+:$PYTHONPATH} exec "$PY" \
            -m vllm.entrypoints.cli.main "${args[@]}") > "$log" 2>&1 &
    else
        # shellcheck disable=SC2086
        "$PY" -m vllm.entrypoints.cli "${args[@]}" --disable-log-requests $M > "$log" 2>&1 &
    fi
    pid=$!
    if wait_health "$PORT" "$pid" "$log"; then
        local url=http://127.0.0.1:$PORT c=$B/benchmark_serving.py
        # warm-up (other prompts), then the two measured runs
        step "serving_$engine" "$PY" $c --base-url "$url" --num-prompts 16 --seed 1 \
            --input-len 128 --output-len 16 > /dev/null
        sed -i 's/^RESULT_JSON /WARMUP_JSON /' "$O/serving_$engine.log"
        step "serving_$engine" "$PY" $c --base-url "$url" --num-prompts 256 \
            --request-rate inf --max-concurrency 64 --input-len 128 --output-len 128
        step "serving_$engine" "$PY" $c --base-url "$url" --num-prompts 64 \
            --request-rate 16 --input-len 128 --output-len 128
        sed -n 's/^RESULT_JSON //p' "$O/serving_$engine.log" | "$PY" -c 'import json, sys
for line in sys.stdin:
    print(json.dumps({"bench": "serving_vs_upstream", "engine": sys.argv[1], **json.loads(line)}))
' "$engine" >> "$O/serving_vs_upstream.jsonl"
    else
        status=1
    fi
    kill -INT "$pid" 2>/dev/null
    wait "$pid"
}

upstream_ready() {  # upstream vLLM importable and SmolLM2 converted, else fail
    if ! upstream_py -c 'import vllm.v1' 2>/dev/null; then
        echo "bench upstream: no upstream vLLM in $VSITE (../shared/tools/peer/README.md)" \
            | tee -a "$O/vs_upstream.log"
        status=1
        return 1
    fi
    if [[ ! -f $SMOLLM2_HF/config.json ]]; then
        step convert "$PY" $B/convert_gguf_to_hf.py --out "$SMOLLM2_HF" --dtype bfloat16 || return 1
    fi
}

bench_upstream_offline() {
    upstream_ready || return 1
    vs_upstream --model "$SMOLLM2_HF" --workloads 1,8,64
    vs_upstream --model "$ROOT/$B/configs/qwen2.5-0.5b" --load-format dummy --workloads nano
    vs_upstream --model "$ROOT/$B/configs/llama-3.1-8b" --load-format dummy --workloads 1
    "$PY" $B/benchmark_vs_upstream.py --summarize "$O/vs_upstream.jsonl" \
        | tee "$O/vs_upstream_ratios.jsonl"
}

bench_upstream_serve() {
    upstream_ready || return 1
    serve_vs_upstream upstream
    serve_vs_upstream fork
}

bench() {
    case ${1:-all} in
        core) bench_core ;;
        spec) bench_spec ;;
        serve) bench_serve ;;
        apc) bench_apc ;;
        structured) bench_structured ;;
        pp) bench_pp ;;
        chunked) bench_chunked ;;
        upstream) bench_upstream_offline; bench_upstream_serve ;;
        upstream-offline) bench_upstream_offline ;;
        upstream-serve) bench_upstream_serve ;;
        all) bench_core; bench_spec; bench_serve; bench_apc; bench_chunked; bench_structured
            bench_pp ;;
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
