#!/usr/bin/env bash
# Prepared for the next 2-GPU session (not yet run). Session 5 left #6's batch-1 target on
# the GPU's kernel chain: decode-loop graphs took the host out of the per-token loop, and
# FLASHINFER's Triton small-decode kernel (off by default) was not faster than FlashInfer.
# GPU 0, alone (no concurrent tests: the eager and batch-1 numbers are host-sensitive):
#   the decode-attention kernel study (FlashInfer vs the Triton kernel at its tiles), then
#   batch 1 with each switch (small path on/off, loop graphs on/off, PDL on/off), then the
#   nano workload with the small path on and off.
# GPU 1: the GPU tests session 5 could not run (TORCH_SDPA loop graphs on a real GPU, the
#   speculative FLASHINFER tests), then the PP pairwise suite needs both GPUs: run it last.
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
 $T tests/worker/test_cuda_graphs_gpu.py tests/spec_decode/test_spec_gpu.py \
    -k "TORCH_SDPA and (single_sequence or multi_step) or FLASHINFER-small and drifts or flashinfer_bf16 or 40" \
    2>&1 | tail -n 25 > $O/t_gpu1.log
) &
b=$!
wait $a $b
python -m pytest --forked -q -p no:cacheprovider tests/distributed/test_pipeline_parallel.py \
    -k pp2_matches_pp1 2>&1 | tail -n 15 > $O/t_pp.log
kill $CAP_PID 2>/dev/null
grep -h '^{"bench"' $O/bench.log | cut -c1-420
cat $O/t_gpu1.log $O/t_pp.log | grep -E "passed|failed|FAILED|Error" | tail -n 20
