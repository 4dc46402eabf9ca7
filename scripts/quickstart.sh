#!/usr/bin/env bash
# One command from a fresh clone to a trained model in ./output:
#   bash scripts/quickstart.sh [run.py options...]
# Needs Docker and python3. Does the set-up it can: on Debian/Ubuntu with root (or sudo) it installs and starts the
# Docker Engine and python3-venv when missing (scripts/setup_docker.sh, the same set-up as tests/run.sh); elsewhere
# it says how to get Docker. Prepares the host tools in .venv-host (docker SDK, rich; no torch). With NVIDIA GPUs it
# uses the CUDA image of the newest row the driver runs (--cuda auto), pulled when a published one matches
# (TRAINKIT_REGISTRY, default ghcr.io/trainkit), else built, saying first what the build costs; without GPUs the
# CPU flavor (pulled or built the same way). Trains the `tiny` preset on the embedded corpus unless ./data holds
# data or .env says otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v python3 >/dev/null || { echo "quickstart needs python3 (3.10 or newer): install it, then run this again" >&2; exit 1; }
bash scripts/setup_docker.sh
VENV=${TRAINKIT_HOST_VENV:-.venv-host}
if ! "$VENV/bin/python" -c 'import docker, rich, pydantic_settings, dotenv, hostlist, compose, packaging' 2>/dev/null; then
  echo "== preparing the host tools in $VENV (docker SDK, rich, compose v2; no torch)"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q -e '.[host]'
fi
choice=(--cuda auto)   # with GPUs: the newest row this host's driver runs
for arg in "$@"; do case "$arg" in --cuda|--cuda=*|--image|--image=*) choice=() ;; esac; done
exec "$VENV/bin/python" scripts/run.py train --build-if-missing ${choice[@]+"${choice[@]}"} "$@"
