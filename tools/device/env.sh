# Source on the GPU host after the offline bundle is staged (see README.md here):
# installs it once into /tmp/site and sets the environment every GPU script expects.
if [[ ! -d /tmp/site/flashinfer ]]; then
    bash .stage/p03/install.sh >/dev/null || return 1
fi
export PYTHONPATH=/tmp/site:$PWD
export FLASHINFER_WORKSPACE_BASE=/tmp/fiws HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p "${OUT:-/tmp/out}"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
