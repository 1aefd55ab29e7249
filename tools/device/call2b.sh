#!/usr/bin/env bash
# Session-3 2-GPU call B: the remaining PP=2 regression cases, then the PP benchmark (1.5B
# and 8B shapes), capped.
source tools/device/env.sh || exit 1
O=${OUT:-/tmp/out}
P=tests/distributed/test_pipeline_parallel.py::test_pp2_matches_pp1
timeout ${CAP_TESTS:-240} python -m pytest --forked -q -p no:cacheprovider -rs \
    "$P[tiny_llama_dir-TORCH_SDPA-False]" "$P[smollm2_gguf-TORCH_SDPA-True]" \
    "$P[tiny_llama_dir-FLASHINFER-True]" "$P[smollm2_gguf-FLASHINFER-False]" \
    > $O/pp_tests.log 2>&1
for m in qwen2.5-1.5b llama-3.1-8b; do
timeout ${CAP_BENCH:-110} python benchmarks/benchmark_pipeline_parallel.py \
    --model benchmarks/configs/$m --num-prompts 128 --output-json $O/pp_bench.jsonl \
    > $O/pp_bench_$m.log 2>&1
done
tail -n 15 $O/pp_tests.log
grep -h '^{' $O/pp_bench_*.log | cut -c1-1200
