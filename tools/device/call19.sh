#!/usr/bin/env bash
# Session 10, second call (2 GPUs): single-sequence prefill graphs (graph_runner's
# prefill_graphs, VLLM_PREFILL_GRAPH_MAX_TOKENS, default 1024).
# GPU 0: the SmolLM2 batch-1 line at 8 and at 32 scheduler steps (graphs, eager,
# transformers), SmolLM2's benchmark_latency (prefill latency) with prefill graphs and with
# them off, the Llama-3.1-8B shape. GPU 1: the engine graph tests the change touches
# (prefill graphs, batch-1 per backend, graph vs padded eager as the batch drifts) and the
# speculative-decoding GPU tests (the draft runner captures prefill graphs too).
source tools/device/env.sh || exit 1
cap_runtime ${CAP:-500}
L="--dtype bfloat16 --batch-size 1 --input-len 128 --output-len 128 --max-num-seqs 8 --num-iters-warmup 1 --num-iters 3 --no-tqdm --num-scheduler-steps 8"
(export CUDA_VISIBLE_DEVICES=0
 python $B/benchmark_throughput.py $SMOL_B1 --num-iters 2 --hf-peer
 python $B/benchmark_throughput.py ${SMOL_B1/--num-scheduler-steps 8/--num-scheduler-steps 32} \
    --num-iters 2 --hf-peer
 python $B/benchmark_latency.py $L
 VLLM_PREFILL_GRAPH_MAX_TOKENS=0 python $B/benchmark_latency.py $L
 python $B/benchmark_latency.py $LLAMA8B_B1 --num-iters 3
) > $O/bench.log 2>&1 &
a=$!
(export CUDA_VISIBLE_DEVICES=1
 T="python -m pytest --forked -q -p no:cacheprovider -rs"
 $T tests/worker/test_cuda_graphs_gpu.py -k "prefill_graphs or drifts or single_sequence" \
    2>&1 | tail -n 12 > $O/t_gpu1.log
 $T tests/spec_decode/test_spec_gpu.py 2>&1 | tail -n 8 > $O/t_spec.log
) &
b=$!
wait $a $b
kill "$CAP_PID" 2>/dev/null
grep -h '^{"bench"' $O/bench.log | cut -c1-700
cat $O/t_gpu1.log $O/t_spec.log | grep -E "passed|failed|FAILED|Error|assert|skipped" | tail -n 30
