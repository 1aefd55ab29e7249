#!/usr/bin/env bash
# Decode-step profiles on one GPU: SmolLM2 batch 1 and 64 (Triton ops on and off),
# Qwen2.5-0.5B shape (dummy weights) batch 256. Run from the repo root after env.sh.
cd benchmarks || exit 1
G="--gpu-memory-utilization 0.3 --top 30"
python profile_decode.py --batch-size 1 --output-len 64 $G
VLLM_USE_TRITON_OPS=0 python profile_decode.py --batch-size 1 --output-len 64 $G --top 12
python profile_decode.py --batch-size 64 --output-len 64 $G
python profile_decode.py --model configs/qwen2.5-0.5b --load-format dummy --skip-tokenizer-init \
    --max-model-len 2048 --batch-size 256 --output-len 32 $G
