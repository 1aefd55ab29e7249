#!/usr/bin/env bash
# Session 11 (2-GPU machine): every #6 target on the final code, in
# the runs bench.sh makes (each ratio from one run: the SmolLM2 sweep at batch 1, 8 and 64
# with transformers in the same run and the plot, the Llama-3.1-8B shape, the nano
# workload), on GPU 0; the engine graph tests not run in session 10 on GPU 1. Then, in a
# second call on the same machine, `bash tools/device/call20.sh` (PP pairwise suite).
# Restore session 10's JIT caches first, in a call of their own that carries .stage/jit:
# `mkdir -p /tmp/jit && cp .stage/jit/* /tmp/jit/` (env.sh unpacks them).
source tools/device/env.sh || exit 1
cap_runtime ${CAP:-520}
(export CUDA_VISIBLE_DEVICES=0
 bash tools/device/bench.sh core
) > $O/bench.log 2>&1 &
a=$!
(export CUDA_VISIBLE_DEVICES=1
 python -m pytest --forked -q -p no:cacheprovider -rs tests/worker/test_cuda_graphs_gpu.py \
    -k "not single_sequence and not drifts and not prefill_graphs" 2>&1 | tail -n 8 > $O/t_gpu.log
) &
b=$!
wait $a $b
kill "$CAP_PID" 2>/dev/null
grep -h '^{"bench"' $O/bench.log | cut -c1-700
cat $O/t_gpu.log | grep -E "passed|failed|FAILED|Error|assert" | tail -n 20
