#!/usr/bin/env bash
# Session-3 first 2-GPU call: decode profiles and multi-step numbers on GPU 0, the 8B shape
# on GPU 1 (each capped), then the JIT cache is saved to $OUT for the next machine.
source tools/device/env.sh || exit 1
O=${OUT:-/tmp/out}
B=benchmarks
CAP=${CAP:-420}
(export CUDA_VISIBLE_DEVICES=0; cd $B
 G="--gpu-memory-utilization 0.3 --top 40"
 python profile_decode.py --batch-size 1 --output-len 64 $G
 python profile_decode.py --batch-size 1 --output-len 64 $G --num-scheduler-steps 8 --top 5
 python benchmark_throughput.py --dtype bfloat16 --batch-sizes 1,64 --input-len 128 \
    --output-len 128 --num-iters 1 --hf-peer --no-tqdm --num-scheduler-steps 8 \
    --gpu-memory-utilization 0.3 --output-json $O/sweep.jsonl
 python profile_decode.py --batch-size 64 --output-len 64 $G --num-scheduler-steps 8 --top 25
 python benchmark_throughput.py --model configs/qwen2.5-0.5b --load-format dummy \
    --skip-tokenizer-init --max-model-len 4096 --dtype bfloat16 --dataset random-range \
    --num-prompts 256 --no-tqdm --num-scheduler-steps 8 --output-json $O/nano.jsonl
) > $O/gpu0.log 2>&1 &
a=$!
(export CUDA_VISIBLE_DEVICES=1; cd $B
 for s in 1 8; do
 python benchmark_latency.py --model configs/llama-3.1-8b --load-format dummy \
    --skip-tokenizer-init --max-model-len 2048 --dtype bfloat16 --batch-size 1 --input-len 128 \
    --output-len 128 --max-num-seqs 8 --num-iters 2 --num-iters-warmup 1 --no-tqdm \
    --num-scheduler-steps $s --output-json $O/llama8b.jsonl
 done
) > $O/gpu1.log 2>&1 &
b=$!
(sleep $CAP; pkill -f benchmarks/; pkill -f profile_decode; pkill -f benchmark_) >/dev/null 2>&1 &
k=$!
wait $a $b
kill $k 2>/dev/null
save_jit
grep -h '^{"bench"' $O/gpu0.log $O/gpu1.log | cut -c1-700
grep -h "Error\|error" $O/gpu0.log $O/gpu1.log | tail -5
