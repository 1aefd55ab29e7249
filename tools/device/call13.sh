#!/usr/bin/env bash
# Session 8, second 2-GPU call (the L2 prefetch it measured gave no gain and was reverted:
# VLLM_GEMV_L2_PREFETCH no longer exists). The whole-row GEMV now prefetches the rest of an L2-sized
# weight into L2 before pdl_wait (VLLM_GEMV_L2_PREFETCH, default on): on the small-decode
# path o_proj streams in while the decode attention runs. GPU 0, alone: the Llama-3.1-8B
# shape on the small path with and without the prefetch, on the wrappers, and again with
# it; then a SmolLM2 batch-1 profile on the wrappers (call12 profiled the small path).
# GPU 1: the GEMV GPU tests (bit-equal with and without the prefetch), then the spec
# decoding GPU tests with the small path at one row (VLLM_SMALL_DECODE_MAX_ROWS=1).
source tools/device/env.sh || exit 1
cap_runtime ${CAP:-480}
L8="$LLAMA8B_B1 --num-iters 3"
(export CUDA_VISIBLE_DEVICES=0
 VLLM_SMALL_DECODE_MAX_ROWS=1 python $B/benchmark_latency.py $L8
 VLLM_SMALL_DECODE_MAX_ROWS=1 VLLM_GEMV_L2_PREFETCH=0 python $B/benchmark_latency.py $L8
 VLLM_SMALL_DECODE_MAX_ROWS=0 python $B/benchmark_latency.py $L8
 VLLM_SMALL_DECODE_MAX_ROWS=1 python $B/benchmark_latency.py $L8
 VLLM_SMALL_DECODE_MAX_ROWS=0 python $B/profile_decode.py --batch-size 1 --input-len 128 \
    --output-len 128 --num-scheduler-steps 8 --dtype bfloat16 --top 12 \
    --gpu-memory-utilization 0.3 > $O/prof0.log 2>&1; grep '^{"bench"' $O/prof0.log
) > $O/bench.log 2>&1 &
a=$!
(export CUDA_VISIBLE_DEVICES=1
 T="python -m pytest --forked -q -p no:cacheprovider -rs"
 $T tests/models/test_triton_gemv.py -k cuda 2>&1 | tail -n 5 > $O/t_gemv.log
 VLLM_SMALL_DECODE_MAX_ROWS=1 $T tests/spec_decode/test_spec_gpu.py 2>&1 | tail -n 25 > $O/t_spec.log
) &
b=$!
wait $a $b
kill "$CAP_PID" 2>/dev/null
grep -h '^{"bench"' $O/bench.log | python3 -c "
import json, sys
keys = ('bench', 'small_decode_max_rows', 'gemv_l2_prefetch', 'time_per_output_token_s', 'bandwidth_floor_ratio',
        'ms_per_step', 'busy_ms', 'idle_ms', 'long_gaps', 'long_gap_ms', 'kernels_per_step')
for l in sys.stdin:
    d = json.loads(l)
    print({k: d[k] for k in keys if k in d})"
cat $O/t_gemv.log $O/t_spec.log | grep -E "passed|failed|FAILED|Error|assert" | tail -n 20
