#!/usr/bin/env bash
# Session-5 2-GPU call B, run right after call A on the same machine: the PP pairwise suite
# (FLASHINFER's small path now runs on every stage), then side by side the speculative
# FLASHINFER tests (GPU 0) and the TORCH_SDPA / two-VE graph tests (GPU 1).
source tools/device/env.sh || exit 1
O=${OUT:-/tmp/out}
cap_runtime ${CAP:-560}
T="python -m pytest --forked -q -p no:cacheprovider -rs"
$T tests/distributed/test_pipeline_parallel.py -k pp2_matches_pp1 2>&1 | tail -n 25 > $O/t_pp.log
(CUDA_VISIBLE_DEVICES=0 $T tests/spec_decode/test_spec_gpu.py -k "flashinfer or 40" 2>&1 \
    | tail -n 25 > $O/t_spec.log) &
(CUDA_VISIBLE_DEVICES=1 $T tests/worker/test_cuda_graphs_gpu.py \
    -k "TORCH_SDPA and (single_sequence or multi_step) or two_virtual" 2>&1 \
    | tail -n 25 > $O/t_sdpa.log) &
wait %1 %2
kill $CAP_PID 2>/dev/null
for f in t_pp t_spec t_sdpa; do echo "== $f"; grep -E "passed|failed|FAILED|Error" $O/$f.log | tail -n 8; done
