"""benchmarks/startup.py end to end on the CPU image: one round, every row printed with a plausible value.

The goal itself is not asserted (speed goals live in the benchmark's report, not in timed tests).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_startup_benchmark_reports_every_part(cpu_image: str, engine_memlock: int) -> None:
    env = {**os.environ, "TRAINKIT_MEMLOCK": str(engine_memlock)}
    command = [sys.executable, "-m", "benchmarks.startup", "--cpu", "--repeat", "1", "--image", cpu_image]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = dict(re.findall(r"^  (.+?)\s+(-?\d+\.\d\d) s$", done.stdout, re.MULTILINE))
    floor = float(rows["docker run IMAGE python -c pass"])
    up = float(rows["docker compose up -> first step"])
    imports = "library imports, docker run to the end of: "
    torch_import = float(rows[imports + "import torch"])
    trainer_import = float(rows[imports + "import torch; from transformers import Trainer"])
    assert 0 < floor < up, done.stdout
    assert 0 < torch_import < trainer_import, done.stdout
    difference = next(value for label, value in rows.items() if label.startswith("difference ("))
    assert abs(float(difference) - (up - floor)) < 0.011, done.stdout
    assert "the goal of <= 3 s" in done.stdout
