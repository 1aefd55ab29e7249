#!/usr/bin/env bash
# Session 10, last call (2 GPUs), after the prefill-graph defaults changed (512 tokens, one
# warm-up each). GPU 0: the SmolLM2 batch-1 line at 8 scheduler steps (capture
# time with the new defaults), then the prefill-graph engine test. GPU 1: the
# speculative-decoding GPU tests (the draft captures prefill graphs too). Then the PP
# pairwise suite (PP = 2 against PP = 1, whose one-sequence prefills replay graphs).
source tools/device/env.sh || exit 1
cap_runtime ${CAP:-500}
T="python -m pytest --forked -q -p no:cacheprovider -rs"
(export CUDA_VISIBLE_DEVICES=0
 python $B/benchmark_throughput.py $SMOL_B1 --num-iters 2 --hf-peer > $O/bench.log 2>&1
 grep -h "Captured" $O/bench.log | cut -c1-300
 $T tests/worker/test_cuda_graphs_gpu.py -k prefill_graphs 2>&1 | tail -n 4 > $O/t_gpu1.log
) &
a=$!
(export CUDA_VISIBLE_DEVICES=1
 $T tests/spec_decode/test_spec_gpu.py 2>&1 | tail -n 8 > $O/t_spec.log
) &
b=$!
wait $a $b
pp_and_report $O/t_gpu1.log $O/t_spec.log
