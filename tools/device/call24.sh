#!/usr/bin/env bash
# Session 11, after call_next.sh on the same 2-GPU machine: the PP pairwise suite first
# (not run on sessions 9-10's code), then the batch-1 vs-transformers tests whose
# stricter backend-run assertions (21103ed) have not yet run on a GPU.
source tools/device/env.sh || exit 1
cap_runtime ${CAP:-500}
: > $O/bench.log
python -m pytest --forked -q -p no:cacheprovider tests/distributed/test_pipeline_parallel.py \
    -k pp2_matches_pp1 2>&1 | tail -n 15 > $O/t_pp.log
cat $O/t_pp.log | grep -E "passed|failed|FAILED|Error|assert" | tail -n 20
(export CUDA_VISIBLE_DEVICES=0
 python -m pytest --forked -q -p no:cacheprovider -rs tests/worker/test_cuda_graphs_gpu.py \
    -k "single_sequence and (TORCH_SDPA or small)" 2>&1 | tail -n 8 > $O/t_gpu0.log) &
a=$!
(export CUDA_VISIBLE_DEVICES=1
 python -m pytest --forked -q -p no:cacheprovider -rs tests/worker/test_cuda_graphs_gpu.py \
    -k "single_sequence and not TORCH_SDPA and not small" 2>&1 | tail -n 8 > $O/t_gpu1.log) &
b=$!
wait $a $b
kill "$CAP_PID" 2>/dev/null
cat $O/t_gpu0.log $O/t_gpu1.log | grep -E "passed|failed|FAILED|Error|assert" | tail -n 20
