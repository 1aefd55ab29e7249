#!/usr/bin/env bash
# Format and lint the project with ruff (settings in pyproject.toml).
#   bash format.sh                 # rewrite files: ruff format, then ruff check --fix
#   bash format.sh --check         # CI: change nothing, fail on any difference or finding
#   bash format.sh [--check] PATH  # limit to some paths
# Exits non-zero when formatting or linting fails.
set -euo pipefail
cd "$(dirname "$0")"

check=0
if [[ "${1:-}" == "--check" ]]; then
    check=1
    shift
fi

RUFF="${RUFF:-ruff}"
if ! command -v "$RUFF" >/dev/null 2>&1; then
    echo "format.sh: '$RUFF' not found; pip install -r requirements-test.txt" >&2
    exit 2
fi

if [[ $# -gt 0 ]]; then
    paths=("$@")
else
    paths=()
    for p in vllm tests benchmarks examples setup.py; do
        [[ -e "$p" ]] && paths+=("$p")
    done
fi
if [[ ${#paths[@]} -eq 0 ]]; then
    echo "format.sh: nothing to check" >&2
    exit 0
fi

echo "format.sh: $("$RUFF" --version) on ${paths[*]}"
if [[ $check -eq 1 ]]; then
    "$RUFF" format --check --diff "${paths[@]}"
    "$RUFF" check "${paths[@]}"
else
    "$RUFF" format "${paths[@]}"
    "$RUFF" check --fix "${paths[@]}"
fi
echo "format.sh: ok"
