#!/usr/bin/env bash
# Session 10, after the prefill-graph defaults changed (512 tokens, one warm-up each).
# GPU 0: the SmolLM2 batch-1 line at 8 scheduler steps (capture time with the new
# defaults), SmolLM2's benchmark_latency, the Llama-3.1-8B shape. GPU 1: the prefill-graph
# engine test and the speculative-decoding GPU tests (the draft captures prefill graphs).
source tools/device/env.sh || exit 1
cap_runtime ${CAP:-400}
L="--dtype bfloat16 --batch-size 1 --input-len 128 --output-len 128 --max-num-seqs 8 --num-iters-warmup 1 --num-iters 3 --no-tqdm --num-scheduler-steps 8"
(export CUDA_VISIBLE_DEVICES=0
 python $B/benchmark_throughput.py $SMOL_B1 --num-iters 2 --hf-peer
 python $B/benchmark_latency.py $L
 python $B/benchmark_latency.py $LLAMA8B_B1 --num-iters 3
) > $O/bench.log 2>&1 &
a=$!
(export CUDA_VISIBLE_DEVICES=1
 T="python -m pytest --forked -q -p no:cacheprovider -rs"
 $T tests/spec_decode/test_spec_gpu.py tests/worker/test_cuda_graphs_gpu.py -k \
    "spec or prefill_graphs" 2>&1 | tail -n 8 > $O/t_spec.log
) &
b=$!
wait $a $b
kill "$CAP_PID" 2>/dev/null
grep -h '^{"bench"' $O/bench.log | cut -c1-900
grep -h "Captured" $O/bench.log | cut -c1-300
cat $O/t_spec.log | grep -E "passed|failed|FAILED|Error|assert|skipped" | tail -n 20
