"""Build times of the CPU image: cold build, warm rebuild after a trainer edit, their ratio, and image size.

    python -m benchmarks.build_times              cold (no layer cache, fresh pip/ccache caches) then warm
    python -m benchmarks.build_times --warm-only  only the warm rebuild (uses the latest record as the cold time)

Cold: `build.py --cpu --no-cache` with a new CACHE_ID, so BuildKit's pip and ccache mounts start empty too (the
CPU base itself is reused: it is the stand-in for NGC, which a user pulls rather than builds). Warm: a trainer
file is added to trainer/ (then removed) and `build.py --cpu` runs again.
Goal: warm <= 5% of cold. NGC bases cannot be pulled on a machine without registry access, so the size the image
adds is measured over the CPU base only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "build" / "records" / "trainkit_0.1.0-cpu.json"
# A new file in trainer/ (removed afterwards) stands for an edit, without rewriting anyone's source file.
TOUCHED = ROOT / "trainer" / "_build_times_probe.py"


def build(*extra: str) -> float:
    """`build.py --cpu` (which trusts the host's CA bundle in the build by itself); seconds taken."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "build.py"), "--cpu", *extra],
                          capture_output=True, text=True)  # fmt: skip
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"build failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return elapsed


def warm_rebuild() -> float:
    try:
        TOUCHED.write_text(f"# written by benchmarks/build_times.py for one rebuild ({time.time()}); safe to delete\n")
        return build()
    finally:
        TOUCHED.unlink(missing_ok=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warm-only", action="store_true")
    args = parser.parse_args()
    if args.warm_only:
        cold = json.loads(RECORD.read_text())["durations"]["total_s"] if RECORD.is_file() else float("nan")
        cold_how = "latest recorded build (not necessarily cold)"
    else:
        cold = build("--no-cache", "--build-arg", f"CACHE_ID=-bench{int(time.time())}")
        cold_how = "no layer cache, empty pip/ccache caches"
    warm = warm_rebuild()
    build()  # back to an image of the unmodified tree
    record = json.loads(RECORD.read_text())
    added = record["image"]["size_bytes"] - record["image"]["base_size_bytes"]
    print(f"machine: {os.cpu_count()} CPU cores")
    print(f"cold build:   {cold:8.1f} s  ({cold_how})")
    print(f"warm rebuild: {warm:8.1f} s  (after adding {TOUCHED.relative_to(ROOT)})")
    print(f"warm / cold:  {100 * warm / cold:8.1f} %  (goal <= 5 %)")
    print(f"image size:   {record['image']['size_bytes'] / 1e9:8.2f} GB; adds {added / 1e9:.2f} GB over the CPU base "
          f"{record['base']['image']} ({record['image']['base_size_bytes'] / 1e9:.2f} GB)")  # fmt: skip
    print("NGC: not measured here (no registry access); the goal there is <= 2 GB over the NGC base")
    return 0


if __name__ == "__main__":
    sys.exit(main())
