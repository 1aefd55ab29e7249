#!/usr/bin/env bash
# Session 10, first call (1 GPU): where SmolLM2's 128-token prefill spends its 14.3 ms.
# A prefill-only request (128 prompt tokens, 1 output token) under torch.profiler (table by
# host time) and cProfile (by own and by cumulative time); benchmark_latency's prefill
# latency with FLASHINFER and with TORCH_SDPA; then the batch-1 line at 32
# scheduler steps with transformers (the baseline before this session's changes).
source tools/device/env.sh || exit 1
cap_runtime ${CAP:-480}
P="--batch-size 1 --input-len 128 --output-len 1 --dtype bfloat16 --gpu-memory-utilization 0.3"
L="--dtype bfloat16 --batch-size 1 --input-len 128 --output-len 128 --max-num-seqs 8 --num-iters-warmup 1 --num-iters 3 --no-tqdm --num-scheduler-steps 8"
{
 python $B/profile_decode.py $P --top 45 --cprofile-sort tottime,cumtime \
    --table-sort self_cpu_time_total > $O/prof_prefill.log 2>&1
 grep '^{"bench"' $O/prof_prefill.log
 python $B/benchmark_latency.py $L
 VLLM_ATTENTION_BACKEND=TORCH_SDPA python $B/benchmark_latency.py $L
 python $B/benchmark_throughput.py ${SMOL_B1/--num-scheduler-steps 8/--num-scheduler-steps 32} \
    --num-iters 2 --hf-peer
} > $O/bench.log 2>&1
kill "$CAP_PID" 2>/dev/null
grep -h '^{"bench"' $O/bench.log | cut -c1-600
grep -E "Error|error" $O/bench.log | head
