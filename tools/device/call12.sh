#!/usr/bin/env bash
# Session 8, first 2-GPU call. The Triton decode kernel now issues its first tile's cache
# reads (and the row's length, position, cos / sin) before pdl_wait, so they overlap the
# qkv GEMV before it. GPU 0, alone: SmolLM2 batch 1 (graphs only, 3 timed runs) on the
# small path against FlashInfer's wrappers, twice in alternation; the Llama-3.1-8B shape on
# both paths; the decode-attention study (compare with session 7's numbers); a profile of
# SmolLM2 batch 1 on each path (GPU busy / idle per step, the gaps between multi-step
# windows). GPU 1: the decode-attention, fused-layer and FLASHINFER-small / -fused engine
# GPU tests.
source tools/device/env.sh || exit 1
cap_runtime ${CAP:-570}
S="--dtype bfloat16 --input-len 128 --output-len 128 --num-prompts 1 --max-num-seqs 8 --no-tqdm --num-scheduler-steps 8 --num-iters 3"
L8="$LLAMA8B_B1 --num-iters 3"
(export CUDA_VISIBLE_DEVICES=0
 for r in 1 0 1 0; do VLLM_SMALL_DECODE_MAX_ROWS=$r python $B/benchmark_throughput.py $S; done
 for r in 1 0; do VLLM_SMALL_DECODE_MAX_ROWS=$r python $B/benchmark_latency.py $L8; done
 python $B/kernel_decode_attention.py --shapes smollm2,llama-3.1-8b --batch-sizes 1 \
    --contexts 192,1024 --tiles 16,32
 for r in 1 0; do VLLM_SMALL_DECODE_MAX_ROWS=$r python $B/profile_decode.py --batch-size 1 \
    --input-len 128 --output-len 128 --num-scheduler-steps 8 --dtype bfloat16 --top 12 \
    --gpu-memory-utilization 0.3 > $O/prof$r.log 2>&1; grep '^{"bench"' $O/prof$r.log; done
) > $O/bench.log 2>&1 &
a=$!
(export CUDA_VISIBLE_DEVICES=1
 T="python -m pytest --forked -q -p no:cacheprovider -rs"
 $T tests/attention/test_triton_decode.py tests/models/test_triton_layer.py -k cuda \
    2>&1 | tail -n 5 > $O/t_kern.log
 $T tests/worker/test_cuda_graphs_gpu.py -k "FLASHINFER-small or FLASHINFER-fused" \
    2>&1 | tail -n 25 > $O/t_gpu1.log
) &
b=$!
wait $a $b
kill "$CAP_PID" 2>/dev/null
grep -h -E '^\{"(bench|shape)"' $O/bench.log | python3 -c "
import json, sys
keys = ('bench', 'shape', 'context', 'small_decode_max_rows', 'output_tokens_per_s',
        'time_per_output_token_s', 'bandwidth_floor_ratio', 'flashinfer_us', 'triton_us',
        'triton_tile16_us', 'triton_tile32_us', 'ms_per_step', 'busy_ms', 'idle_ms',
        'long_gaps', 'long_gap_ms', 'largest_gap_us', 'kernels_per_step')
for l in sys.stdin:
    d = json.loads(l)
    print({k: d[k] for k in keys if k in d})"
cat $O/t_kern.log $O/t_gpu1.log | grep -E "passed|failed|FAILED|Error|assert" | tail -n 20
