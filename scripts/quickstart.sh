#!/usr/bin/env bash
# One command from a fresh clone to a trained model in ./output:
#   bash scripts/quickstart.sh [run.py options...]
# Needs Docker. Uses the GPU image where the engine sees NVIDIA GPUs, else builds and uses the
# CPU flavor (no registry needed). Trains the `tiny` preset on the embedded corpus unless ./data
# holds data or .env says otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TRAINKIT_HOST_VENV:-.venv-host}
if ! "$VENV/bin/python" -c 'import docker, rich, pydantic_settings, dotenv, hostlist' 2>/dev/null; then
  echo "== preparing the host tools in $VENV (docker SDK, rich; no torch)"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q -e '.[host]'
fi
exec "$VENV/bin/python" scripts/run.py train --build-if-missing "$@"
