#!/usr/bin/env bash
# Prepared for the next 2-GPU session (not yet run). Session 6 ran the TORCH_SDPA loop-graph,
# spec-decoding and small-path / fused-layer GPU tests (passed) but not the PP pairwise
# suite, which has not run since session 5's changes (decode-loop graphs, PDL, the small
# path). GPU 0, alone: the decode-attention kernel study (FlashInfer vs the Triton kernel at
# its tiles), batch 1 per switch, nano per small-path setting. GPU 1: the FLASHINFER-small
# drift test. Then the PP suite on both GPUs.
source tools/device/env.sh || exit 1
O=${OUT:-/tmp/out}
B=benchmarks
cap_runtime ${CAP:-570}
S="--dtype bfloat16 --input-len 128 --output-len 128 --num-iters 1 --no-tqdm --batch-sizes 1 --num-scheduler-steps 8"
N="--model $B/configs/qwen2.5-0.5b --load-format dummy --skip-tokenizer-init --max-model-len 4096 --dtype bfloat16 --dataset random-range --num-prompts 256 --no-tqdm --num-scheduler-steps 8"
(export CUDA_VISIBLE_DEVICES=0
 python $B/kernel_decode_attention.py --shapes smollm2,qwen2.5-0.5b --batch-sizes 1,8 \
    --contexts 64,256,1024,2048 --tiles 16,32
 python $B/benchmark_throughput.py $S
 VLLM_SMALL_DECODE_MAX_ROWS=8 python $B/benchmark_throughput.py $S
 VLLM_SMALL_DECODE_MAX_ROWS=8 VLLM_DECODE_LOOP_GRAPHS=0 python $B/benchmark_throughput.py $S
 VLLM_TRITON_PDL=0 python $B/benchmark_throughput.py $S
 python $B/benchmark_throughput.py $N
 VLLM_SMALL_DECODE_MAX_ROWS=8 python $B/benchmark_throughput.py $N
) > $O/bench.log 2>&1 &
a=$!
(export CUDA_VISIBLE_DEVICES=1
 T="python -m pytest --forked -q -p no:cacheprovider -rs"
 $T tests/worker/test_cuda_graphs_gpu.py \
    -k "FLASHINFER-small and drifts" \
    2>&1 | tail -n 25 > $O/t_gpu1.log
) &
b=$!
wait $a $b
pp_and_report $O/t_gpu1.log
