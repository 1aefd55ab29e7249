#!/usr/bin/env bash
# Session-5 2-GPU call A (decode-loop graphs + the Triton small-decode kernel).
# GPU 0: the kernel tests, the SmolLM2 graph suite on FLASHINFER (small path and wrappers,
# batch 1 with and without decode-loop graphs, drift, multi-step), then a batch-1 profile.
# GPU 1: the README sweep (graphs / eager / transformers at 1, 8, 64, multi-step 8) with its
# plot, the Llama-8B-shape latency, the nano workload.
source tools/device/env.sh || exit 1
O=${OUT:-/tmp/out}
B=benchmarks
cap_runtime ${CAP:-570}
(export CUDA_VISIBLE_DEVICES=0
 T="python -m pytest --forked -q -p no:cacheprovider -rs"
 $T tests/attention/test_triton_decode.py tests/models/test_triton_gemv.py -k cuda 2>&1 \
    | tail -n 15 > $O/t_kern.log
 $T tests/worker/test_cuda_graphs_gpu.py -k "FLASHINFER and (single_sequence or multi_step_graphs or drifts or vs_transformers and False) or replay_past" \
    2>&1 | tail -n 40 > $O/t_graphs.log
 python $B/profile_decode.py --batch-size 1 --output-len 64 --gpu-memory-utilization 0.3 \
    --top 25 --num-scheduler-steps 8 > $O/prof.log 2>&1
) &
a=$!
(export CUDA_VISIBLE_DEVICES=1
 S="--dtype bfloat16 --input-len 128 --output-len 128 --num-iters 1 --no-tqdm"
 python $B/benchmark_throughput.py $S --batch-sizes 1,8,64 --hf-peer --num-scheduler-steps 8 \
    --output-json $O/sweep.jsonl
 python $B/plot_throughput.py $O/sweep.jsonl --out $O/throughput_vs_batch.png || true
 python $B/benchmark_latency.py --model $B/configs/llama-3.1-8b --load-format dummy \
    --skip-tokenizer-init --max-model-len 2048 --dtype bfloat16 --batch-size 1 --input-len 128 \
    --output-len 128 --max-num-seqs 8 --num-iters 2 --num-iters-warmup 1 --no-tqdm \
    --num-scheduler-steps 8
 python $B/benchmark_throughput.py --model $B/configs/qwen2.5-0.5b --load-format dummy \
    --skip-tokenizer-init --max-model-len 4096 --dtype bfloat16 --dataset random-range \
    --num-prompts 256 --no-tqdm --num-scheduler-steps 8
) > $O/bench.log 2>&1 &
b=$!
wait $a $b
kill $CAP_PID 2>/dev/null
grep -h '^{"bench"' $O/bench.log $O/prof.log | cut -c1-600
cat $O/t_kern.log $O/t_graphs.log | grep -v "^$" | tail -n 45
grep -B2 -A28 "Top kernels" $O/prof.log | head -40
