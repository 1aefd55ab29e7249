#!/usr/bin/env bash
# Session-6 2-GPU call: the fused one-token decoder layer (triton_layer).
# GPU 0, alone: SmolLM2 batch 1 (ms8) with the layer kernel (small path at 1 row), without
#   it, and on FlashInfer's wrappers; a profile; the Llama-8B shape and nano at 1 row.
# GPU 1: the kernel tests, then the FLASHINFER small-path engine tests (the layer in graphs).
source tools/device/env.sh || exit 1
O=${OUT:-/tmp/out}
B=benchmarks
cap_runtime ${CAP:-570}
S="--dtype bfloat16 --input-len 128 --output-len 128 --num-iters 1 --no-tqdm --batch-sizes 1 --num-scheduler-steps 8"
L8="--model $B/configs/llama-3.1-8b --load-format dummy --skip-tokenizer-init --max-model-len 2048 --dtype bfloat16 --batch-size 1 --input-len 128 --output-len 128 --max-num-seqs 8 --num-iters 2 --num-iters-warmup 1 --no-tqdm --num-scheduler-steps 8"
N="--model $B/configs/qwen2.5-0.5b --load-format dummy --skip-tokenizer-init --max-model-len 4096 --dtype bfloat16 --dataset random-range --num-prompts 256 --no-tqdm --num-scheduler-steps 8"
(export CUDA_VISIBLE_DEVICES=0
 VLLM_SMALL_DECODE_MAX_ROWS=1 python $B/benchmark_throughput.py $S --hf-peer
 VLLM_SMALL_DECODE_MAX_ROWS=1 VLLM_FUSED_DECODER_LAYER=0 python $B/benchmark_throughput.py $S
 VLLM_SMALL_DECODE_MAX_ROWS=0 python $B/benchmark_throughput.py $S
 VLLM_SMALL_DECODE_MAX_ROWS=1 python $B/profile_decode.py --batch-size 1 --output-len 64 \
    --gpu-memory-utilization 0.3 --top 12 --num-scheduler-steps 8 > $O/prof.log 2>&1
 VLLM_SMALL_DECODE_MAX_ROWS=1 python $B/benchmark_throughput.py $N
 VLLM_SMALL_DECODE_MAX_ROWS=1 python $B/benchmark_latency.py $L8
 VLLM_SMALL_DECODE_MAX_ROWS=0 python $B/benchmark_latency.py $L8
) > $O/bench.log 2>&1 &
a=$!
(export CUDA_VISIBLE_DEVICES=1
 T="python -m pytest --forked -q -p no:cacheprovider -rs"
 $T tests/models/test_triton_layer.py tests/models/test_triton_gemv.py \
    tests/attention/test_triton_decode.py -k cuda 2>&1 | tail -n 30 > $O/t_kern.log
 $T tests/worker/test_cuda_graphs_gpu.py \
    -k "FLASHINFER-small and (single_sequence or multi_step or drifts or vs_transformers)" \
    2>&1 | tail -n 40 > $O/t_graphs.log
) &
b=$!
wait $a $b
kill $CAP_PID 2>/dev/null
grep -h '^{"bench"' $O/bench.log $O/prof.log | cut -c1-400
cat $O/t_kern.log $O/t_graphs.log | grep -E "passed|failed|FAILED|Error|assert" | tail -n 30
grep -A14 "Self CUDA %" $O/prof.log | cut -c1-60,150-200 | head -16
