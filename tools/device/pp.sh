#!/usr/bin/env bash
# 2-GPU checks: PP=2 regression tests (mp and Ray) and the PP benchmark. After env.sh.
O=${OUT:-/tmp/out}
set -x
what=${1:-all}
if [[ $what == all || $what == tests ]]; then
P=tests/distributed/test_pipeline_parallel.py::test_pp2_matches_pp1
python -m pytest --forked -q -p no:cacheprovider -rs "$P[smollm2_gguf-FLASHINFER-False]" \
    tests/distributed/test_ray_executor.py::test_gpu_ray_pp2_smollm2_graphs \
    "$P[tiny_llama_dir-TORCH_SDPA-False]" "$P[smollm2_gguf-TORCH_SDPA-True]" \
    "$P[tiny_llama_dir-FLASHINFER-True]" 2>&1 | tee $O/pp_tests.log
fi
if [[ $what == all || $what == bench ]]; then
for m in qwen2.5-1.5b llama-3.1-8b; do
python benchmarks/benchmark_pipeline_parallel.py --model benchmarks/configs/$m \
    --output-json $O/pp_bench.jsonl
done
fi
