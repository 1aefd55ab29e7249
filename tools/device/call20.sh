#!/usr/bin/env bash
# Session 10, third call (same 2-GPU machine): the PP pairwise suite (PP = 2 against PP = 1,
# whose one-sequence prefills now replay prefill graphs), with the kernel GPU tests and the
# remaining engine graph tests on GPU 1 first.
source tools/device/env.sh || exit 1
cap_runtime ${CAP:-540}
(export CUDA_VISIBLE_DEVICES=1
 T="python -m pytest --forked -q -p no:cacheprovider -rs"
 $T tests/worker/test_cuda_graphs_gpu.py -k "vs_transformers and not single_sequence" \
    2>&1 | tail -n 8 > $O/t_gpu2.log
)
: > $O/bench.log
pp_and_report $O/t_gpu2.log
