"""The host tools as quickstart.sh prepares them: a venv with only the `host` extra (no torch, no test packages) runs
the orchestration scripts. The test venv has more installed, so an import the extra lacks shows only here (matrix.py's
`packaging` once broke the README's first command)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_host_extra_alone_plans_a_build_and_a_run(tmp_path: Path) -> None:
    """Without the host tools a script says in one line what to install (scripts/host_tools.py); with the extra
    alone it plans a build and a run."""
    venv = tmp_path / "host"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    bare = subprocess.run([python, "scripts/build.py", "--cpu", "--dry-run"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert bare.returncode == 2 and "Traceback" not in bare.stderr, bare.stderr[-3000:]  # before the host tools
    assert bare.stderr.count("\n") == 1 and "lacks docker" in bare.stderr and "pip install -e '.[host]'" in bare.stderr
    subprocess.run([python, "-m", "pip", "install", "-q", "-e", ".[host]"], cwd=ROOT, check=True, timeout=600)
    plan = subprocess.run([python, "scripts/build.py", "--cpu", "--dry-run"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert "plan: trainkit" in plan.stdout and "Traceback" not in plan.stderr
    torch = subprocess.run([python, "-c", "import torch"], capture_output=True, timeout=60)
    assert torch.returncode != 0, "the host venv must not hold torch"
