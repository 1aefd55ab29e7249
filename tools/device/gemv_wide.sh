#!/usr/bin/env bash
# 1 GPU, no bundle: the read ceiling and the persistent whole-row GEMV (triton_gemv_rows)
# for the bandwidth-bound Llama-3.1-8B shapes at one row, against cuBLAS and the tiled
# kernel's best (narrow grid). Pass 1 compiles every config in parallel (one process per
# op, output dropped); pass 2 times them alone.
export PYTHONPATH=$PWD TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name --format=csv,noheader
cd benchmarks
A="--models llama-3.1-8b --rows 1 --sweep --grid rows --lm-head"
for op in norm+qkv o norm+gate_up+silu down lm_head; do
    python kernel_gemv.py $A --iters 2 --ops $op >/dev/null 2>&1 &
done
wait
python kernel_gemv.py $A --iters 20 > $O/gemv_rows.log 2>&1
grep -v "^#   " $O/gemv_rows.log | grep -v Warn | cut -c1-420
