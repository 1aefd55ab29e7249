#!/usr/bin/env bash
# Prepared for the next 2-GPU session (not yet run). Session 9's issue line gave 98.1x
# transformers at batch 1 (8 scheduler steps); its graphs-only run at 32 steps gave 1487
# tok/s. GPU 0: the SmolLM2 batch-1 line at 8 and at 32 scheduler steps, the
# Llama-3.1-8B shape twice, then a profile of a prefill-only request (128 prompt tokens, 1
# output token: where the 14.3 ms of host time per prefill goes). GPU 1: the kernel GPU
# tests. Then the PP pairwise suite (not run in session 9).
# Copy session 9's JIT caches first, in a call of their own that carries .stage/jit:
# `mkdir -p /tmp/jit && cp .stage/jit/* /tmp/jit/` (env.sh unpacks them).
source tools/device/env.sh || exit 1
cap_runtime ${CAP:-560}
(export CUDA_VISIBLE_DEVICES=0
 python $B/benchmark_throughput.py $SMOL_B1 --num-iters 2 --hf-peer
 python $B/benchmark_throughput.py ${SMOL_B1/--num-scheduler-steps 8/--num-scheduler-steps 32} \
    --num-iters 2 --hf-peer
 for i in 1 2; do python $B/benchmark_latency.py $LLAMA8B_B1 --num-iters 3; done
 python $B/profile_decode.py --batch-size 1 --input-len 128 --output-len 1 \
    --num-scheduler-steps 8 --dtype bfloat16 --top 30 --gpu-memory-utilization 0.3 \
    > $O/prof_prefill.log 2>&1; grep '^{"bench"' $O/prof_prefill.log
) > $O/bench.log 2>&1 &
a=$!
(export CUDA_VISIBLE_DEVICES=1
 python -m pytest --forked -q -p no:cacheprovider -rs tests/attention/test_triton_decode.py \
    tests/models/test_triton_layer.py tests/models/test_triton_gemv.py \
    tests/samplers/test_triton_greedy.py -k cuda 2>&1 | tail -n 5 > $O/t_kern.log
) &
b=$!
wait $a $b
pp_and_report $O/t_kern.log
