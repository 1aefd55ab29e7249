#!/usr/bin/env bash
# Second 2-GPU call: PP=2 tests (mp and Ray) then the PP benchmark, capped.
source tools/device/env.sh || exit 1
O=${OUT:-/tmp/out}
timeout ${CAP_TESTS:-270} bash tools/device/pp.sh tests > $O/pp.log 2>&1
timeout ${CAP_BENCH:-150} python benchmarks/benchmark_pipeline_parallel.py \
    --model benchmarks/configs/qwen2.5-1.5b --num-prompts 128 --output-json $O/pp_bench.jsonl \
    > $O/pp_bench.log 2>&1
grep -h "passed\|failed\|error\|Error" $O/pp.log | tail -n 20
grep -h '^{' $O/pp_bench.log | cut -c1-1500
