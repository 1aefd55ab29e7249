#!/usr/bin/env bash
# Session 8, third 2-GPU call, with the small-decode path at one row (the new default,
# VLLM_SMALL_DECODE_MAX_ROWS=1, exported so the run does not depend on the tree's default):
# GPU 0: SmolLM2 batch 1 x 128 with graphs, eager and transformers (the ratio line),
# then the Llama-3.1-8B shape once more; then the PP pairwise suite on both GPUs.
source tools/device/env.sh || exit 1
export VLLM_SMALL_DECODE_MAX_ROWS=1
cap_runtime ${CAP:-500}
(export CUDA_VISIBLE_DEVICES=0
 python $B/benchmark_throughput.py $SMOL_B1 --num-iters 2 --hf-peer
 python $B/benchmark_latency.py $LLAMA8B_B1 --num-iters 3
) > $O/bench.log 2>&1
pp_and_report
