#!/usr/bin/env bash
# Session-4 2-GPU call B (after call5a on the same machine): PP=2 vs PP=1 benchmark with
# the GPU busy fractions over the timed window, then a batch-1 decode profile.
source tools/device/env.sh || exit 1
O=${OUT:-/tmp/out}
B=benchmarks
cap_runtime ${CAP:-330}
python $B/benchmark_pipeline_parallel.py --model $B/configs/qwen2.5-1.5b --num-prompts 256 \
    > $O/pp.log 2>&1
CUDA_VISIBLE_DEVICES=0 python $B/profile_decode.py --batch-size 1 --output-len 64 \
    --num-scheduler-steps 8 --top 30 > $O/profile.log 2>&1
kill $CAP_PID 2>/dev/null
grep -h '^{"bench"' $O/pp.log $O/profile.log | cut -c1-900
