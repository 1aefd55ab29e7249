#!/usr/bin/env bash
# Prepared for the next GPU session (2 x H200), one capped call: what session 3 could not
# measure. GPU 0: decode profiles and the README sweep at --num-scheduler-steps 8 and 16
# (capture memory is in the JSON: graph_capture_gib, target <= 0.5 after the shared
# FlashInfer workspace), the 8B shape at 8 and 16 steps. GPU 1: PP=2 vs PP=1 benchmark (busy
# fractions now over the timed window only) needs both GPUs, so it runs after GPU 0 is done.
# $OUT keeps to 8 files: three logs (JSON lines inside) and the JIT cache parts.
source tools/device/env.sh || exit 1
O=${OUT:-/tmp/out}
B=benchmarks
CAP=${CAP:-560}
(sleep $CAP; pkill -f benchmarks/) >/dev/null 2>&1 &
k=$!
(export CUDA_VISIBLE_DEVICES=0; cd $B
 G="--gpu-memory-utilization 0.3"
 python profile_decode.py --batch-size 1 --output-len 64 $G --num-scheduler-steps 8 --top 30
 python profile_decode.py --batch-size 64 --output-len 64 $G --num-scheduler-steps 8 --top 30
 for s in 8 16; do
 python benchmark_throughput.py --dtype bfloat16 --batch-sizes 1,64 --input-len 128 \
    --output-len 128 --num-iters 1 --hf-peer --no-tqdm --num-scheduler-steps $s $G
 done
) > $O/gpu0.log 2>&1 &
a=$!
(export CUDA_VISIBLE_DEVICES=1; cd $B
 for s in 8 16; do
 python benchmark_latency.py --model configs/llama-3.1-8b --load-format dummy \
    --skip-tokenizer-init --max-model-len 2048 --dtype bfloat16 --batch-size 1 --input-len 128 \
    --output-len 128 --max-num-seqs 8 --num-iters 2 --num-iters-warmup 1 --no-tqdm \
    --num-scheduler-steps $s
 done
) > $O/gpu1.log 2>&1 &
b=$!
wait $a $b
python $B/benchmark_pipeline_parallel.py --model $B/configs/qwen2.5-1.5b --num-prompts 256 \
    > $O/pp.log 2>&1
kill $k 2>/dev/null
save_jit
grep -h '^{"bench"' $O/gpu0.log $O/gpu1.log $O/pp.log | cut -c1-700
