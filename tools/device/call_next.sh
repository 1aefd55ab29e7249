#!/usr/bin/env bash
# Prepared for the next 2-GPU session (not yet run). Session 7 capped the Triton decode
# tile at 32 tokens from the kernel study alone (SmolLM2's shape: 8.5 against 10.3 us per
# layer at context 192) and could not run the engine on it. GPU 0, alone: SmolLM2 batch 1
# on the small path (now tile 32) against FlashInfer's wrappers, twice in alternation; the
# Llama-3.1-8B shape on both paths (the floor ratio was 0.742 / 0.736 on the small path,
# 0.722 / 0.711 on the wrappers); the nano workload per path. GPU 1: the decode-attention,
# fused-layer and FLASHINFER-small engine GPU tests on the new tile. Then the PP suite.
source tools/device/env.sh || exit 1
cap_runtime ${CAP:-570}
S="$SMOL_B1 --num-iters 2"
L8="$LLAMA8B_B1 --num-iters 3"
N="$NANO"
(export CUDA_VISIBLE_DEVICES=0
 for r in 1 0 1 0; do VLLM_SMALL_DECODE_MAX_ROWS=$r python $B/benchmark_throughput.py $S; done
 for r in 1 0; do VLLM_SMALL_DECODE_MAX_ROWS=$r python $B/benchmark_latency.py $L8; done
 for r in 0 1; do VLLM_SMALL_DECODE_MAX_ROWS=$r python $B/benchmark_throughput.py $N; done
) > $O/bench.log 2>&1 &
a=$!
(export CUDA_VISIBLE_DEVICES=1
 T="python -m pytest --forked -q -p no:cacheprovider -rs"
 $T tests/attention/test_triton_decode.py tests/models/test_triton_layer.py -k cuda \
    2>&1 | tail -n 5 > $O/t_kern.log
 $T tests/worker/test_cuda_graphs_gpu.py -k "FLASHINFER-small or FLASHINFER-fused" \
    2>&1 | tail -n 25 > $O/t_gpu1.log
) &
b=$!
wait $a $b
pp_and_report $O/t_kern.log $O/t_gpu1.log
