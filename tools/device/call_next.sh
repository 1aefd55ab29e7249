#!/usr/bin/env bash
# Prepared for the next 2-GPU session (not yet run). Session 8 moved the one-row Triton
# kernels' PDL trigger after their wait (VLLM_PDL_TRIGGER=late, default) from a kernel-level
# measurement only (kernel_decoder_layer.py: SmolLM2 shape 26.3 -> 20.9 us a layer), and
# made FLASHINFER's small-decode path take one-row steps by default. GPU 0, alone: SmolLM2
# batch 1 (graphs only, 3 timed runs) late against early, twice in alternation, and on the
# wrappers (small path off) late; the Llama-3.1-8B shape late against early; the issue's
# SmolLM2 batch-1 line (graphs, eager, transformers) on the defaults; a default profile.
# GPU 1: the kernel and engine GPU tests on the defaults. Then the PP pairwise suite.
source tools/device/env.sh || exit 1
cap_runtime ${CAP:-570}
S="--dtype bfloat16 --input-len 128 --output-len 128 --num-prompts 1 --max-num-seqs 8 --no-tqdm --num-scheduler-steps 8 --num-iters 3"
L8="$LLAMA8B_B1 --num-iters 3"
(export CUDA_VISIBLE_DEVICES=0
 for t in late early late early; do VLLM_PDL_TRIGGER=$t python $B/benchmark_throughput.py $S; done
 VLLM_SMALL_DECODE_MAX_ROWS=0 python $B/benchmark_throughput.py $S
 for t in late early; do VLLM_PDL_TRIGGER=$t python $B/benchmark_latency.py $L8; done
 python $B/benchmark_throughput.py $SMOL_B1 --num-iters 2 --hf-peer
 python $B/profile_decode.py --batch-size 1 --input-len 128 --output-len 128 \
    --num-scheduler-steps 8 --dtype bfloat16 --top 12 --gpu-memory-utilization 0.3 \
    > $O/prof.log 2>&1; grep '^{"bench"' $O/prof.log
) > $O/bench.log 2>&1 &
a=$!
(export CUDA_VISIBLE_DEVICES=1
 T="python -m pytest --forked -q -p no:cacheprovider -rs"
 $T tests/attention/test_triton_decode.py tests/models/test_triton_layer.py \
    tests/models/test_triton_gemv.py -k cuda 2>&1 | tail -n 5 > $O/t_kern.log
 $T tests/worker/test_cuda_graphs_gpu.py tests/spec_decode/test_spec_gpu.py \
    2>&1 | tail -n 25 > $O/t_gpu1.log
) &
b=$!
wait $a $b
pp_and_report $O/t_kern.log $O/t_gpu1.log
