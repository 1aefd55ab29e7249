#!/usr/bin/env bash
# One 2-GPU call: benchmarks on GPU 0 beside the single-GPU tests on GPU 1 (each capped).
source tools/device/env.sh || exit 1
O=${OUT:-/tmp/out}
(CUDA_VISIBLE_DEVICES=0 timeout ${CAP:-540} bash tools/device/bench.sh > $O/bench.log 2>&1) &
(CUDA_VISIBLE_DEVICES=1 timeout ${CAP:-540} bash tools/device/gpu_tests.sh > $O/tests.log 2>&1) &
wait
grep -h '^{"bench"\|RESULT_JSON' $O/bench.log | cut -c1-1200
grep -h "passed\|failed\|error" $O/t_*.log
