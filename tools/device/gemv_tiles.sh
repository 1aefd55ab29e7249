#!/usr/bin/env bash
# No bundle, 1 GPU: the small path's decoder-layer chain (kernel_decoder_layer.py's
# "separate" variant, 30 layers in a graph) with other one-row GEMV tiles (BLOCK_N x
# BLOCK_K [x warps]; BLOCK_K 0 = the whole weight row in one tile, loaded before the PDL
# wait) and decode-attention tiles, SmolLM2 shape at contexts 192 and 1024.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
cd benchmarks
G=8x512,8x0,4x0,2x0,4x0x8,8x0x8,16x0x8,2x0x2
timeout 200 python kernel_decoder_layer.py --context 192 --iters 100 --nprogs "" \
  --gemv-configs $G --tiles 0,16 2>&1 | grep '"separate"' | cut -c70-
timeout 120 python kernel_decoder_layer.py --context 1024 --iters 100 --nprogs "" \
  --gemv-configs 8x512,4x0,2x0,4x0x8 --tiles 0,16 2>&1 | grep '"separate"' | cut -c70-
