#!/usr/bin/env bash
# Session 9, third 2-GPU call (the machine of call16.sh, still warm): GPU 0 the engine
# graph tests against transformers on the FLASHINFER wrappers and TORCH_SDPA; GPU 1 the
# speculative-decoding GPU tests; then the JIT caches are packed into $OUT (save_jit).
source tools/device/env.sh || exit 1
cap_runtime ${CAP:-300}
T="python -m pytest --forked -q -p no:cacheprovider -rs"
(CUDA_VISIBLE_DEVICES=0 $T tests/worker/test_cuda_graphs_gpu.py \
    -k "vs_transformers and not small and not fused" 2>&1 | tail -n 8 > $O/t_gpu0.log) &
a=$!
(CUDA_VISIBLE_DEVICES=1 $T tests/spec_decode/test_spec_gpu.py 2>&1 | tail -n 8 > $O/t_spec.log) &
b=$!
wait $a $b
kill "$CAP_PID" 2>/dev/null
cat $O/t_gpu0.log $O/t_spec.log | grep -E "passed|failed|FAILED|Error|assert" | tail -n 20
save_jit >/dev/null 2>&1; ls $O
