#!/usr/bin/env bash
# The README table's single-GPU benchmarks (docs/benchmarks.md), JSON lines into $OUT.
# Run from the repo root after `source tools/device/env.sh`. Arg: which set (all by default):
#   core  - SmolLM2 sweep vs transformers (1, 8, 64), 8B latency, nano workload
#   spec  - n-gram / draft batch-1 speedup
#   serve - vllm serve + benchmark_serving
O=${OUT:-/tmp/out}
set -x
what=${1:-all}
B=benchmarks
M="--num-scheduler-steps 8"  # the README table's setting (multi-step decoding)
if [[ $what == all || $what == core ]]; then
python $B/benchmark_throughput.py --dtype bfloat16 --batch-sizes 1,8,64 --input-len 128 \
    --output-len 128 --num-iters 1 --hf-peer --no-tqdm $M --output-json $O/sweep.jsonl
python $B/plot_throughput.py $O/sweep.jsonl --out $O/throughput_vs_batch.png || true
python $B/benchmark_latency.py --model $B/configs/llama-3.1-8b --load-format dummy \
    --skip-tokenizer-init --max-model-len 2048 --dtype bfloat16 --batch-size 1 --input-len 128 \
    --output-len 128 --max-num-seqs 8 --num-iters 2 --num-iters-warmup 1 --no-tqdm $M \
    --output-json $O/llama8b.jsonl
python $B/benchmark_throughput.py --model $B/configs/qwen2.5-0.5b --load-format dummy \
    --skip-tokenizer-init --max-model-len 4096 --dtype bfloat16 --dataset random-range \
    --num-prompts 256 --no-tqdm $M --output-json $O/nano.jsonl
fi
if [[ $what == all || $what == spec ]]; then
python $B/benchmark_spec_decode.py --dtype bfloat16 --num-speculative-tokens 4 \
    --output-json $O/spec.jsonl
fi
if [[ $what == all || $what == serve ]]; then
python -m vllm.entrypoints.cli serve --dtype bfloat16 --port 8011 --max-model-len 2048 \
    --gpu-memory-utilization 0.3 --disable-log-requests > $O/serve.log 2>&1 &
pid=$!
python -c "import time,urllib.request as u
for _ in range(180):
    try: u.urlopen('http://127.0.0.1:8011/health'); break
    except Exception: time.sleep(1)"
python $B/benchmark_serving.py --base-url http://127.0.0.1:8011 --num-prompts 256 \
    --request-rate inf --max-concurrency 64 --input-len 128 --output-len 128 | tee $O/serving.txt
python $B/benchmark_serving.py --base-url http://127.0.0.1:8011 --num-prompts 64 \
    --request-rate 16 --input-len 128 --output-len 128 | tee -a $O/serving.txt
kill -INT $pid; wait $pid
fi
