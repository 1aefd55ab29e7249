#!/usr/bin/env bash
# Session 9, second 2-GPU call, on this session's kernels: the one-row GEMV reading whole
# weight rows before its PDL wait, 16-token decode-attention tiles up to 512 tokens, and
# greedy sampling in two Triton launches (triton_greedy).
# GPU 0: SmolLM2 batch 1 x 128 (graphs; the line with eager and transformers;
# greedy kernels off; 32 scheduler steps), the Llama-3.1-8B shape twice, SmolLM2's
# benchmark_latency (prefill latency). GPU 1: the kernel GPU tests, then the engine graph
# tests of the small-decode / fused paths and multi-step graphs on every backend.
source tools/device/env.sh || exit 1
cap_runtime ${CAP:-470}
S="--dtype bfloat16 --input-len 128 --output-len 128 --num-prompts 1 --max-num-seqs 8 --no-tqdm --num-iters 3"
(export CUDA_VISIBLE_DEVICES=0
 python $B/benchmark_throughput.py $S --num-scheduler-steps 8
 python $B/benchmark_throughput.py $SMOL_B1 --num-iters 2 --hf-peer
 VLLM_USE_TRITON_GREEDY=0 python $B/benchmark_throughput.py $S --num-scheduler-steps 8
 python $B/benchmark_throughput.py $S --num-scheduler-steps 32
 for i in 1 2; do python $B/benchmark_latency.py $LLAMA8B_B1 --num-iters 3; done
 python $B/benchmark_latency.py --dtype bfloat16 --batch-size 1 --input-len 128 \
    --output-len 128 --max-num-seqs 8 --num-iters-warmup 1 --num-iters 3 --no-tqdm \
    --num-scheduler-steps 8
) > $O/bench.log 2>&1 &
a=$!
(export CUDA_VISIBLE_DEVICES=1
 T="python -m pytest --forked -q -p no:cacheprovider -rs"
 $T tests/attention/test_triton_decode.py tests/models/test_triton_layer.py \
    tests/models/test_triton_gemv.py tests/samplers/test_triton_greedy.py -k cuda \
    2>&1 | tail -n 5 > $O/t_kern.log
 $T tests/worker/test_cuda_graphs_gpu.py -k "small or fused or multi_step" \
    2>&1 | tail -n 8 > $O/t_gpu1.log
) &
b=$!
wait $a $b
kill "$CAP_PID" 2>/dev/null
grep -h '^{"bench"' $O/bench.log | cut -c1-300
cat $O/t_kern.log $O/t_gpu1.log | grep -E "passed|failed|FAILED|Error|assert" | tail -n 20
