#!/usr/bin/env bash
# Session 10, last call (1 GPU): the SmolLM2 batch-1 line once the JIT caches are
# warm. A first engine run compiles Triton's kernels for this commit (on a fresh machine
# that took ~4 s inside call22's capture); the second run is the issue's line with
# transformers. Then the JIT caches are packed for the next session (save_jit).
source tools/device/env.sh || exit 1
cap_runtime ${CAP:-230}
python $B/benchmark_throughput.py $SMOL_B1 --num-iters 1 > $O/warm.log 2>&1
grep -h '^{"bench"' $O/warm.log | cut -c1-300
python $B/benchmark_throughput.py $SMOL_B1 --num-iters 2 --hf-peer > $O/bench.log 2>&1
kill "$CAP_PID" 2>/dev/null
grep -h '^{"bench"' $O/bench.log | cut -c1-1200
save_jit
