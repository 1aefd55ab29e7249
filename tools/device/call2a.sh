#!/usr/bin/env bash
# Session-3 2-GPU call A: GPU regression tests on GPU 0 beside the README benchmarks on
# GPU 1 (multi-step 8), each capped; JSON lines and pytest summaries printed at the end.
source tools/device/env.sh || exit 1
O=${OUT:-/tmp/out}
B=benchmarks
CAP=${CAP:-540}
(export CUDA_VISIBLE_DEVICES=0
 T="python -m pytest --forked -q -p no:cacheprovider -rs"
 $T tests/models/test_triton_ops.py -k cuda 2>&1 | tail -n 5 > $O/t_triton.log
 $T tests/worker/test_cuda_graphs_gpu.py -k "multi_step_graphs and FLASHINFER or vs_transformers and FLASHINFER and False or drifts and FLASHINFER" 2>&1 | tail -n 30 > $O/t_graphs.log
 $T tests/spec_decode/test_spec_gpu.py 2>&1 | tail -n 40 > $O/t_spec.log
 python benchmarks/benchmark_spec_decode.py --dtype bfloat16 --num-speculative-tokens 4 \
    --output-json $O/spec.jsonl > $O/spec_bench.log 2>&1
) &
a=$!
(export CUDA_VISIBLE_DEVICES=1
 M="--num-scheduler-steps 8"
 python $B/benchmark_throughput.py --dtype bfloat16 --batch-sizes 1,8,64 --input-len 128 \
    --output-len 128 --num-iters 1 --hf-peer --no-tqdm $M --output-json $O/sweep.jsonl
 python $B/plot_throughput.py $O/sweep.jsonl --out $O/throughput_vs_batch.png || true
 python $B/benchmark_throughput.py --model $B/configs/qwen2.5-0.5b --load-format dummy \
    --skip-tokenizer-init --max-model-len 4096 --dtype bfloat16 --dataset random-range \
    --num-prompts 256 --no-tqdm $M --output-json $O/nano.jsonl
 python $B/benchmark_latency.py --model $B/configs/llama-3.1-8b --load-format dummy \
    --skip-tokenizer-init --max-model-len 2048 --dtype bfloat16 --batch-size 1 --input-len 128 \
    --output-len 128 --max-num-seqs 8 --num-iters 2 --num-iters-warmup 1 --no-tqdm $M \
    --output-json $O/llama8b.jsonl
) > $O/bench.log 2>&1 &
b=$!
(sleep $CAP; pkill -f benchmarks/; pkill -f pytest) >/dev/null 2>&1 &
k=$!
wait $a $b
kill $k 2>/dev/null
grep -h '^{"bench"\|^{"setting"' $O/bench.log $O/spec_bench.log | cut -c1-900
cat $O/t_*.log | grep -v "^$" | tail -n 60
