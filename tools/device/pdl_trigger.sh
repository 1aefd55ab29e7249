#!/usr/bin/env bash
# No bundle, 1 GPU: the small path's decoder-layer chain (kernel_decoder_layer.py's
# "separate" variant: four Triton GEMVs and the decode attention per layer, 30 layers in a
# graph, SmolLM2 shape) with PDL triggering the next kernel before (early) or after (late)
# each kernel's wait, alternated.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
cd benchmarks
for v in early late early late; do
  VLLM_PDL_TRIGGER=$v TRITON_CACHE_DIR=/tmp/tc_$v timeout 60 python kernel_decoder_layer.py \
    --context 192 --iters 100 --nprogs "" 2>&1 | grep '"separate"' | sed "s/^/$v /"
done
