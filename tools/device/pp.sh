#!/usr/bin/env bash
# 2-GPU checks: PP=2 regression tests (mp and Ray) and the PP benchmark. After env.sh.
O=${OUT:-/tmp/out}
set -x
what=${1:-all}
if [[ $what == all || $what == tests ]]; then
python -m pytest --forked -q -p no:cacheprovider tests/distributed/test_pipeline_parallel.py \
    tests/distributed/test_ray_executor.py -k "pp2_matches_pp1 or gpu" 2>&1 | tee $O/pp_tests.log
fi
if [[ $what == all || $what == bench ]]; then
for m in qwen2.5-1.5b llama-3.1-8b; do
python benchmarks/benchmark_pipeline_parallel.py --model benchmarks/configs/$m \
    --output-json $O/pp_bench.jsonl
done
fi
