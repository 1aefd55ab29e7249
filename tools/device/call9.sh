#!/usr/bin/env bash
# Session-6 2-GPU call B. GPU 0, alone: SmolLM2 batch 1 on FLASHINFER's small path at one
# row (VLLM_SMALL_DECODE_MAX_ROWS=1: loop graphs under multi-step) against its wrappers
# (=0), at 8 and 32 scheduler steps; the Llama-8B shape at 1 and 0. GPU 1: the engine tests
# of the small path / the opt-in fused layer, the TORCH_SDPA loop graphs, spec decoding.
# Then, if the cap allows, the PP pairwise suite on both GPUs.
source tools/device/env.sh || exit 1
O=${OUT:-/tmp/out}
B=benchmarks
cap_runtime ${CAP:-570}
S="--dtype bfloat16 --input-len 128 --output-len 128 --num-iters 1 --no-tqdm --batch-sizes 1"
L8="--model $B/configs/llama-3.1-8b --load-format dummy --skip-tokenizer-init --max-model-len 2048 --dtype bfloat16 --batch-size 1 --input-len 128 --output-len 128 --max-num-seqs 8 --num-iters 2 --num-iters-warmup 1 --no-tqdm --num-scheduler-steps 8"
(export CUDA_VISIBLE_DEVICES=0
 VLLM_SMALL_DECODE_MAX_ROWS=1 python $B/benchmark_throughput.py $S --num-scheduler-steps 8 --hf-peer
 VLLM_SMALL_DECODE_MAX_ROWS=0 python $B/benchmark_throughput.py $S --num-scheduler-steps 8
 VLLM_SMALL_DECODE_MAX_ROWS=1 python $B/benchmark_throughput.py $S --num-scheduler-steps 32
 VLLM_SMALL_DECODE_MAX_ROWS=0 python $B/benchmark_throughput.py $S --num-scheduler-steps 32
 VLLM_SMALL_DECODE_MAX_ROWS=1 python $B/benchmark_latency.py $L8
 VLLM_SMALL_DECODE_MAX_ROWS=0 python $B/benchmark_latency.py $L8
) > $O/bench.log 2>&1 &
a=$!
(export CUDA_VISIBLE_DEVICES=1
 T="python -m pytest --forked -q -p no:cacheprovider -rs"
 $T tests/models/test_triton_layer.py -k cuda 2>&1 | tail -n 5 > $O/t_kern.log
 $T tests/worker/test_cuda_graphs_gpu.py tests/spec_decode/test_spec_gpu.py \
    -k "single_sequence and (FLASHINFER-fused or FLASHINFER-small) or TORCH_SDPA and multi_step or flashinfer_bf16 or 40" \
    2>&1 | tail -n 30 > $O/t_gpu1.log
) &
b=$!
wait $a $b
pp_and_report $O/t_kern.log $O/t_gpu1.log
