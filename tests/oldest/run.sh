#!/usr/bin/env bash
# The trainer's portable test files (every expectation holds on any row), run plainly by the oldest row's Python:
# tests/trainer/conftest.py and train_runs.py start `python -m trainer` with the venv pytest runs in, so each run
# here is transformers 4.46.3 / torch 2.1.2. tests/run.sh runs it after the main suite; the rest of the 12.1 row's
# host checks are tests/trainer/test_rows.py (marker row_12_1).
# Usage: bash tests/oldest/run.sh [pytest args...]   (after bash tests/oldest/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
PORTABLE=(tests/trainer/test_resume.py tests/trainer/test_outputs.py tests/trainer/test_stop_signals.py)
[ -x .venv-oldest/bin/python ] || { echo "no .venv-oldest: run bash tests/oldest/setup.sh" >&2; exit 2; }
exec .venv-oldest/bin/python -m pytest -ra -p no:cacheprovider "${PORTABLE[@]}" "$@"
