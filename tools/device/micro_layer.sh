export PYTHONPATH=$PWD TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
python -c "
import torch
from tests.models import test_triton_layer as t
for dt in (torch.float32, torch.bfloat16):
    print('cases', dt, t._cases(dt, 'cuda', exact_proj=False))
" 2>&1 | tail -5
cd benchmarks
python kernel_decoder_layer.py --context 192 --nprogs 0,96,64,32 --block-ns 8,16 --phase-times 2>&1 | grep -v Warn
python kernel_decoder_layer.py --context 1024 --nprogs 0,64 --block-ns 8 2>&1 | grep bench
VLLM_TRITON_PDL=0 python kernel_decoder_layer.py --context 192 --nprogs 0 --block-ns 8 2>&1 | grep bench
