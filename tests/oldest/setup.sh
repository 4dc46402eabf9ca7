#!/usr/bin/env bash
# The host's "oldest row" venv: the 12.1 row's Python stack (transformers 4.46.3, torch 2.1.2) on the
# host Python, so the trainer's unit and tiny-train tests catch most version breakage without an image.
# Usage: bash tests/oldest/setup.sh [VENV]   (default .venv-oldest at the repository root; idempotent)
# Then:  python -m pytest tests/trainer -m row_12_1; bash tests/oldest/run.sh (the portable test files on it)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${1:-$root/.venv-oldest}"
stamp="$venv/.trainkit-oldest-$(cat "$root/tests/oldest/requirements.txt" "$0" | sha256sum | cut -c1-12)"
if [[ -f "$stamp" ]]; then echo "oldest venv up to date: $venv"; exit 0; fi
python_bin="${PYTHON:-python3.11}"
"$python_bin" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
# PyPI's torch 2.1.2 Linux wheel is the CUDA 12.1 build (it runs on CPU); it pulls its nvidia-* wheels.
"$venv/bin/python" -m pip install -q -r "$root/tests/oldest/requirements.txt"
# DeepSpeed's setup.py imports torch: build it against the venv's torch, Python side only (ops JIT on use).
DS_BUILD_OPS=0 "$venv/bin/python" -m pip install -q --no-build-isolation "deepspeed==$(sed -n 's/^deepspeed = "\(.*\)"/\1/p' "$root/images/versions.toml")"
"$venv/bin/python" -m pip install -q --no-deps -e "$root"
touch "$stamp"
"$venv/bin/python" -c "import torch, transformers; print('oldest venv:', torch.__version__, transformers.__version__)"
