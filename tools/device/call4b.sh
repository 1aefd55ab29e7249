#!/usr/bin/env bash
# Session-4 2-GPU call B (after call4a on the same machine). GPU 0: the SmolLM2 graph suite
# on FlashInfer (vs transformers, graph == eager as the batch drifts, multi-step), which now
# runs the small-batch kernels. GPU 1: the nano workload (Qwen2.5-0.5B shape). Then the
# PP=2 vs PP=1 benchmark on both GPUs and the JIT caches for the next machine.
source tools/device/env.sh || exit 1
O=${OUT:-/tmp/out}
B=benchmarks
CAP=${CAP:-480}
(sleep $CAP; pkill -f benchmarks/; pkill -f pytest) >/dev/null 2>&1 &
k=$!
(export CUDA_VISIBLE_DEVICES=0
 T="python -m pytest --forked -q -p no:cacheprovider -rs"
 $T tests/worker/test_cuda_graphs_gpu.py -k "multi_step_graphs and FLASHINFER or vs_transformers and FLASHINFER and False or drifts and FLASHINFER" 2>&1 | tail -n 30 > $O/t_graphs.log
) &
a=$!
(export CUDA_VISIBLE_DEVICES=1
 python $B/benchmark_throughput.py --model $B/configs/qwen2.5-0.5b --load-format dummy \
    --skip-tokenizer-init --max-model-len 4096 --dtype bfloat16 --dataset random-range \
    --num-prompts 256 --no-tqdm --num-scheduler-steps 8
) > $O/nano.log 2>&1 &
b=$!
wait $a $b
python $B/benchmark_pipeline_parallel.py --model $B/configs/qwen2.5-1.5b --num-prompts 256 \
    > $O/pp.log 2>&1
kill $k 2>/dev/null
save_jit
grep -h '^{"bench"' $O/nano.log $O/pp.log | cut -c1-700
cat $O/t_graphs.log
