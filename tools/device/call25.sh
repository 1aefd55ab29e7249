#!/usr/bin/env bash
# Session 11, third call (same 2-GPU machine): the engine graph tests call_next.sh left
# out (prefill graphs, batch drift) on GPU 0 beside the speculative-decoding GPU suite on
# GPU 1, so every GPU test has run on the final code.
source tools/device/env.sh || exit 1
cap_runtime ${CAP:-500}
: > $O/bench.log
(export CUDA_VISIBLE_DEVICES=0
 python -m pytest --forked -q -p no:cacheprovider -rs tests/worker/test_cuda_graphs_gpu.py \
    -k "prefill_graphs or drifts" 2>&1 | tail -n 8 > $O/t_gpu0.log) &
a=$!
(export CUDA_VISIBLE_DEVICES=1
 python -m pytest --forked -q -p no:cacheprovider -rs tests/spec_decode/test_spec_gpu.py \
    2>&1 | tail -n 8 > $O/t_spec.log) &
b=$!
wait $a $b
kill "$CAP_PID" 2>/dev/null
cat $O/t_gpu0.log $O/t_spec.log | grep -E "passed|failed|FAILED|Error|assert" | tail -n 20
