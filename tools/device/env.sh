# Source on the GPU host after the offline bundle is staged (see README.md here):
# installs it once into /tmp/site and sets the environment every GPU script expects.
if [[ ! -d /tmp/site/flashinfer ]]; then
    bash .stage/p03/install.sh >/dev/null || return 1
fi
export PYTHONPATH=/tmp/site:$PWD
export FLASHINFER_WORKSPACE_BASE=/tmp/fiws TRITON_CACHE_DIR=/tmp/fiws/triton
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
# A JIT cache saved by save_jit (below) on an earlier machine skips FlashInfer's compiles:
# carry .stage/jit in a call of its own that runs `mkdir -p /tmp/jit && cp .stage/jit/* /tmp/jit/`.
if [[ -f /tmp/jit/fiws.tgz.00 && ! -d /tmp/fiws ]]; then
    mkdir -p /tmp/fiws && cat /tmp/jit/fiws.tgz.* | tar -xz -C /tmp/fiws
fi
save_jit() {  # $OUT takes files of at most 16 MiB: split the archive
    tar -cz -C /tmp/fiws . | split -b 15M -d - "${OUT:-/tmp/out}/fiws.tgz."
    ls -la "${OUT:-/tmp/out}"/fiws.tgz.*
}
cap_runtime() {  # kill the benchmark and pytest processes after $1 seconds (the call's cap)
    (sleep "$1"; pkill -f benchmarks/; pkill -f pytest) >/dev/null 2>&1 &
    CAP_PID=$!
}
mkdir -p "${OUT:-/tmp/out}"
O=${OUT:-/tmp/out}
B=benchmarks
# The call scripts' shared benchmark arguments (each adds its --num-iters): SmolLM2 batch 1
# x 128 (benchmark_throughput), the Llama-3.1-8B shape at batch 1 (benchmark_latency) and
# the Qwen2.5-0.5B shape on nano-vllm's workload (benchmark_throughput).
SMOL_B1="--dtype bfloat16 --input-len 128 --output-len 128 --no-tqdm --batch-sizes 1 --num-scheduler-steps 8"
LLAMA8B_B1="--model $B/configs/llama-3.1-8b --load-format dummy --skip-tokenizer-init --max-model-len 2048 --dtype bfloat16 --batch-size 1 --input-len 128 --output-len 128 --max-num-seqs 8 --num-iters-warmup 1 --no-tqdm --num-scheduler-steps 8"
NANO="--model $B/configs/qwen2.5-0.5b --load-format dummy --skip-tokenizer-init --max-model-len 4096 --dtype bfloat16 --dataset random-range --num-prompts 256 --no-tqdm --num-scheduler-steps 8"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
pp_and_report() {  # after a call's GPU jobs: the PP pairwise suite, stop the cap, print results
    local o="${OUT:-/tmp/out}"  # args: the test logs to summarise besides the PP one
    python -m pytest --forked -q -p no:cacheprovider tests/distributed/test_pipeline_parallel.py \
        -k pp2_matches_pp1 2>&1 | tail -n 15 > "$o/t_pp.log"
    kill "$CAP_PID" 2>/dev/null
    grep -h '^{"bench"' "$o/bench.log" | cut -c1-400
    cat "$@" "$o/t_pp.log" | grep -E "passed|failed|FAILED|Error|assert" | tail -n 20
}
