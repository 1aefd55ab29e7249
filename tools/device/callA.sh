#!/usr/bin/env bash
# One 2-GPU call: benchmarks on GPU 0 beside the single-GPU tests on GPU 1 (each capped).
source tools/device/env.sh || exit 1
O=${OUT:-/tmp/out}
CAP=${CAP:-540}
(export CUDA_VISIBLE_DEVICES=0; for s in spec serve core; do bash tools/device/bench.sh $s; done \
    > $O/bench.log 2>&1) &
b=$!
(CUDA_VISIBLE_DEVICES=1 bash tools/device/gpu_tests.sh > $O/tests.log 2>&1) &
t=$!
(sleep $CAP; pkill -f benchmarks/; pkill -f pytest; pkill -f vllm.entrypoints) >/dev/null 2>&1 &
k=$!
wait $b $t
kill $k 2>/dev/null
grep -h '^{"bench"\|RESULT_JSON' $O/bench.log | cut -c1-1500
grep -h "passed\|failed\|error" $O/t_*.log
