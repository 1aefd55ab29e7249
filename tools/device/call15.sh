#!/usr/bin/env bash
# Session 9, first 2-GPU call: the engine A/B of the PDL trigger that session 8 moved after
# the wait (VLLM_PDL_TRIGGER=late, default) from a kernel-level measurement only.
# GPU 0, alone: SmolLM2 batch 1 (graphs only, 3 timed runs) late / early twice, alternated;
# late at 32 scheduler steps; the Llama-3.1-8B shape late / early; the SmolLM2
# batch-1 line (graphs, eager, transformers); a default profile.
# GPU 1: the kernel GPU tests and the small-path engine GPU tests on the defaults.
# Then the JIT caches are packed into $OUT (save_jit) for the next machine.
source tools/device/env.sh || exit 1
cap_runtime ${CAP:-520}
S="--dtype bfloat16 --input-len 128 --output-len 128 --num-prompts 1 --max-num-seqs 8 --no-tqdm --num-iters 3"
(export CUDA_VISIBLE_DEVICES=0
 for t in late early late early; do VLLM_PDL_TRIGGER=$t python $B/benchmark_throughput.py $S --num-scheduler-steps 8; done
 python $B/benchmark_throughput.py $S --num-scheduler-steps 32
 for t in late early; do VLLM_PDL_TRIGGER=$t python $B/benchmark_latency.py $LLAMA8B_B1 --num-iters 3; done
 python $B/benchmark_throughput.py $SMOL_B1 --num-iters 2 --hf-peer
 python $B/profile_decode.py --batch-size 1 --input-len 128 --output-len 128 \
    --num-scheduler-steps 8 --dtype bfloat16 --top 12 --gpu-memory-utilization 0.3 \
    > $O/prof.log 2>&1; grep '^{"bench"' $O/prof.log
) > $O/bench.log 2>&1 &
a=$!
(export CUDA_VISIBLE_DEVICES=1
 T="python -m pytest --forked -q -p no:cacheprovider -rs"
 $T tests/attention/test_triton_decode.py tests/models/test_triton_layer.py \
    tests/models/test_triton_gemv.py -k cuda 2>&1 | tail -n 5 > $O/t_kern.log
 $T tests/worker/test_cuda_graphs_gpu.py -k "small or fused" 2>&1 | tail -n 8 > $O/t_gpu1.log
) &
b=$!
wait $a $b
kill "$CAP_PID" 2>/dev/null
grep -h '^{"bench"' $O/bench.log | cut -c1-600
cat $O/t_kern.log $O/t_gpu1.log | grep -E "passed|failed|FAILED|Error|assert" | tail -n 20
save_jit >/dev/null 2>&1; ls $O
