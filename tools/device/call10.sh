#!/usr/bin/env bash
# Session-7 2-GPU call A. GPU 0, alone: the Llama-3.1-8B shape at batch 1 with the
# persistent whole-row GEMV (default), with cuBLAS (VLLM_USE_TRITON_GEMV=0) and with the
# small-decode attention path (VLLM_SMALL_DECODE_MAX_ROWS=1); then SmolLM2 batch 1 with the
# transformers peer. GPU 1: the GEMV kernel / dispatch GPU tests (the whole-row kernel in
# a layer of 8B widths) and the FLASHINFER batch-1 engine tests vs transformers.
source tools/device/env.sh || exit 1
cap_runtime ${CAP:-560}
S="$SMOL_B1 --num-iters 1"
L8="$LLAMA8B_B1 --num-iters 2"
(export CUDA_VISIBLE_DEVICES=0
 python $B/benchmark_latency.py $L8
 VLLM_USE_TRITON_GEMV=0 python $B/benchmark_latency.py $L8
 VLLM_SMALL_DECODE_MAX_ROWS=1 python $B/benchmark_latency.py $L8
 python $B/benchmark_throughput.py $S --hf-peer
) > $O/bench.log 2>&1 &
a=$!
(export CUDA_VISIBLE_DEVICES=1
 T="python -m pytest --forked -q -p no:cacheprovider -rs"
 $T tests/models/test_triton_gemv.py -k cuda 2>&1 | tail -n 5 > $O/t_kern.log
 $T tests/worker/test_cuda_graphs_gpu.py \
    -k "FLASHINFER and (single_sequence or vs_transformers)" 2>&1 | tail -n 30 > $O/t_gpu1.log
) &
b=$!
wait $a $b
kill "$CAP_PID" 2>/dev/null
grep -h '^{"bench"' $O/bench.log | cut -c1-700
cat $O/t_kern.log $O/t_gpu1.log | grep -E "passed|failed|FAILED|Error|assert" | tail -n 20
