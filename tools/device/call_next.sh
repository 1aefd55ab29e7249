#!/usr/bin/env bash
# Prepared for the next 2-GPU session (not yet run): what session 4 wrote but could not run.
# GPU 0: the batch-1 fused-projection test vs transformers (test_single_sequence_vs_transformers)
# and the kernel tests. Then, on both GPUs: the PP pairwise suite (the batch-1 kernels now run
# on every stage), and the Llama-8B-shape PP benchmark again for the PP=1 busy fraction that
# the pipe bug lost.
source tools/device/env.sh || exit 1
O=${OUT:-/tmp/out}
B=benchmarks
cap_runtime ${CAP:-560}
T="python -m pytest --forked -q -p no:cacheprovider -rs"
CUDA_VISIBLE_DEVICES=0 $T tests/worker/test_cuda_graphs_gpu.py -k single_sequence \
    tests/models/test_triton_gemv.py 2>&1 | tail -n 20 > $O/t_batch1.log
$T tests/distributed/test_pipeline_parallel.py -k pp2_matches_pp1 2>&1 | tail -n 30 > $O/t_pp.log
python $B/benchmark_pipeline_parallel.py --model $B/configs/llama-3.1-8b --num-prompts 256 \
    > $O/pp8b.log 2>&1
kill $CAP_PID 2>/dev/null
grep -h '^{"bench": "pipeline' $O/pp8b.log | cut -c1-900
cat $O/t_batch1.log $O/t_pp.log | grep -v "^$" | tail -n 40
