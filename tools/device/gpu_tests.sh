#!/usr/bin/env bash
# Single-GPU regression tests (after env.sh), most important first; logs into $OUT.
O=${OUT:-/tmp/out}
T="python -m pytest --forked -q -p no:cacheprovider -rs"
$T tests/kernels/test_norm_rotary.py 2>&1 | tail -n 15 > $O/t_triton.log
$T tests/spec_decode/test_spec_gpu.py 2>&1 | tail -n 60 > $O/t_spec.log
$T tests/worker/test_cuda_graphs_gpu.py -k "vs_transformers and FLASHINFER and False" \
    2>&1 | tail -n 40 > $O/t_graphs.log
