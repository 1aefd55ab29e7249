#!/usr/bin/env bash
# Session-4 2-GPU call A. GPU 0: kernel tests (triton_ops, triton_gemv), the SmolLM2 graph
# suite on FlashInfer (vs transformers, graph == eager as the batch drifts, multi-step),
# then the nano workload (Qwen2.5-0.5B shape). GPU 1: the README sweep (graphs, eager,
# transformers at batch 1/8/64, multi-step 8) with its plot; batch 1 at multi-step 16 and
# with the small-batch kernels off; the Llama-8B-shape latency.
source tools/device/env.sh || exit 1
O=${OUT:-/tmp/out}
B=benchmarks
cap_runtime ${CAP:-540}
(export CUDA_VISIBLE_DEVICES=0
 T="python -m pytest --forked -q -p no:cacheprovider -rs"
 $T tests/models/test_triton_gemv.py tests/models/test_triton_ops.py -k cuda 2>&1 | tail -n 15 > $O/t_kern.log
 $T tests/worker/test_cuda_graphs_gpu.py -k "multi_step_graphs and FLASHINFER or vs_transformers and FLASHINFER and False or drifts and FLASHINFER" 2>&1 | tail -n 30 > $O/t_graphs.log
 python $B/benchmark_throughput.py --model $B/configs/qwen2.5-0.5b --load-format dummy \
    --skip-tokenizer-init --max-model-len 4096 --dtype bfloat16 --dataset random-range \
    --num-prompts 256 --no-tqdm --num-scheduler-steps 8 > $O/nano.log 2>&1
) &
a=$!
(export CUDA_VISIBLE_DEVICES=1
 S="--dtype bfloat16 --input-len 128 --output-len 128 --num-iters 1 --no-tqdm"
 python $B/benchmark_throughput.py $S --batch-sizes 1,8,64 --hf-peer --num-scheduler-steps 8 \
    --output-json $O/sweep.jsonl
 python $B/plot_throughput.py $O/sweep.jsonl --out $O/throughput_vs_batch.png || true
 python $B/benchmark_throughput.py $S --batch-sizes 1 --hf-peer --num-scheduler-steps 16
 VLLM_USE_TRITON_GEMV=0 python $B/benchmark_throughput.py $S --batch-sizes 1 --num-scheduler-steps 8
 python $B/benchmark_latency.py --model $B/configs/llama-3.1-8b --load-format dummy \
    --skip-tokenizer-init --max-model-len 2048 --dtype bfloat16 --batch-size 1 --input-len 128 \
    --output-len 128 --max-num-seqs 8 --num-iters 2 --num-iters-warmup 1 --no-tqdm \
    --num-scheduler-steps 8
) > $O/bench.log 2>&1 &
b=$!
wait $a $b
kill $CAP_PID 2>/dev/null
grep -h '^{"bench"' $O/bench.log $O/nano.log | cut -c1-500
cat $O/t_kern.log $O/t_graphs.log | grep -v "^$" | tail -n 40
