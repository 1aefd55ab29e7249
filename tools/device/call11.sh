#!/usr/bin/env bash
# Session-7 last call, 1 GPU, nothing else running on it: the Llama-3.1-8B shape at batch 1
# with the whole-row GEMVs on the small-decode attention path (VLLM_SMALL_DECODE_MAX_ROWS=1)
# and on FlashInfer's wrappers (=0), 3 timed runs each; SmolLM2 batch 1 on both paths;
# then the decode-attention kernel study (FlashInfer vs the Triton kernel at its tiles).
source tools/device/env.sh || exit 1
cap_runtime ${CAP:-500}
S="$SMOL_B1 --num-iters 2"
L8="$LLAMA8B_B1 --num-iters 3"
(VLLM_SMALL_DECODE_MAX_ROWS=1 python $B/benchmark_latency.py $L8
 VLLM_SMALL_DECODE_MAX_ROWS=0 python $B/benchmark_latency.py $L8
 VLLM_SMALL_DECODE_MAX_ROWS=0 python $B/benchmark_throughput.py $S
 VLLM_SMALL_DECODE_MAX_ROWS=1 python $B/benchmark_throughput.py $S
 python $B/kernel_decode_attention.py --shapes smollm2,llama-3.1-8b --batch-sizes 1 \
    --contexts 192,1024 --tiles 16,32,64
) > $O/bench.log 2>&1
kill "$CAP_PID" 2>/dev/null
grep -h '^{"bench"' $O/bench.log | cut -c1-300
grep -h '^{"bench"' $O/bench.log | python3 -c "
import json, sys
for l in sys.stdin:
    d = json.loads(l)
    print({k: d.get(k) for k in ('bench', 'small_decode_max_rows', 'time_per_output_token_s',
          'bandwidth_floor_ratio', 'graphs_output_tokens_per_s') if k in d})"
