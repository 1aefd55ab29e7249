#!/usr/bin/env bash
# Session-4 2-GPU call A. GPU 0: the triton_gemv kernel tests, then benchmarks/kernel_gemv.py
# (default configs for 1-16 rows, then a config sweep at 1 and 8 rows). GPU 1: end-to-end
# SmolLM2 sweep (graphs, eager, transformers) and the Llama-8B-shape latency, each with the
# small-batch kernels on and off (VLLM_USE_TRITON_GEMV), then a batch-1 decode profile.
source tools/device/env.sh || exit 1
O=${OUT:-/tmp/out}
B=benchmarks
CAP=${CAP:-560}
(export CUDA_VISIBLE_DEVICES=0
 T="python -m pytest --forked -q -p no:cacheprovider -rs"
 $T tests/models/test_triton_gemv.py tests/models/test_triton_ops.py -k cuda 2>&1 | tail -n 15 > $O/t_kern.log
 python $B/kernel_gemv.py --models smollm2,llama-3.1-8b --rows 1,2,4,8,16 > $O/kern.log 2>&1
 python $B/kernel_gemv.py --models smollm2,llama-3.1-8b --rows 1,8 --sweep >> $O/kern.log 2>&1
) &
a=$!
(export CUDA_VISIBLE_DEVICES=1
 M="--num-scheduler-steps 8"
 L8="--model $B/configs/llama-3.1-8b --load-format dummy --skip-tokenizer-init --max-model-len 2048
    --dtype bfloat16 --batch-size 1 --input-len 128 --output-len 128 --max-num-seqs 8 --num-iters 2
    --num-iters-warmup 1 --no-tqdm $M"
 python $B/benchmark_throughput.py --dtype bfloat16 --batch-sizes 1,8,64 --input-len 128 \
    --output-len 128 --num-iters 1 --hf-peer --no-tqdm $M
 VLLM_USE_TRITON_GEMV=0 python $B/benchmark_throughput.py --dtype bfloat16 --batch-sizes 1,8 \
    --input-len 128 --output-len 128 --num-iters 1 --no-tqdm $M
 python $B/benchmark_latency.py $L8
 VLLM_USE_TRITON_GEMV=0 python $B/benchmark_latency.py $L8
 python $B/profile_decode.py --batch-size 1 --output-len 64 --num-scheduler-steps 8 --top 30
) > $O/bench.log 2>&1 &
b=$!
(sleep $CAP; pkill -f benchmarks/; pkill -f pytest) >/dev/null 2>&1 &
k=$!
wait $a $b
kill $k 2>/dev/null
grep -h '^{"bench"' $O/bench.log | cut -c1-600
grep -h '"fused_us"' $O/kern.log | cut -c1-400 | head -n 40
cat $O/t_kern.log
