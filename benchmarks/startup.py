"""Startup overhead: seconds from `docker compose up train` to the first training step, side by side with
`docker run IMAGE python -c pass` (container start + interpreter, the floor) in the same run.

    python benchmarks/startup.py [--cpu] [--repeat 3] [--image IMAGE]

The run trains the `tiny` preset (TRAIN_SEQ_LEN=64, one step logged per step) on a small corpus in a
temporary project folder; the first line of output/metrics.jsonl marks the first finished step.
Goal: compose startup at most 3 s above the floor. `--cpu` (the default on engines without the NVIDIA
runtime) layers docker-compose.cpu.yml. Where the engine may not raise the memlock limit ("error setting
rlimit type 8"), run it with TRAINKIT_MEMLOCK=<bytes> as for compose.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
GOAL_S = 3.0
IMPORTS = "import torch; from transformers import Trainer"
SETTINGS = {
    "TRAIN_MODEL": "tiny",
    "TRAIN_SEQ_LEN": "64",
    "TRAIN_BATCH_SIZE": "2",
    "TRAIN_NUM_WORKERS": "0",
    "TRAIN_LOG_STEPS": "1",
    "TRAIN_MAX_STEPS": "2",
    "TRAIN_SAVE_STEPS": "1000",
}


def docker_run_seconds(image: str, code: str) -> float:
    started = time.monotonic()
    subprocess.run(["docker", "run", "--rm", image, "python", "-c", code], check=True, capture_output=True)
    return time.monotonic() - started


def compose_run_seconds(compose: list[str]) -> float:
    """`docker compose run train python -c pass`: compose, the entrypoint and the interpreter, no trainer."""
    started = time.monotonic()
    subprocess.run([*compose, "run", "--rm", "-T", "train", "python", "-c", "pass"], check=True, capture_output=True)
    return time.monotonic() - started


def compose_seconds(folder: Path, compose: list[str]) -> tuple[float, float]:
    """(seconds from `up` to the first metrics line, the first step's own compute time); then `down`."""
    output = folder / "output"
    shutil.rmtree(output, ignore_errors=True)
    output.mkdir()
    metrics = output / "metrics.jsonl"
    started = time.monotonic()
    try:
        up = subprocess.run([*compose, "up", "--detach", "train"], capture_output=True, text=True)
        # Some compose/engine pairs exit 0 when the start fails: the daemon's error is on stderr.
        if up.returncode != 0 or "Error response from daemon" in up.stderr:
            raise SystemExit(f"`docker compose up` failed:\n{up.stderr[-2000:]}")
        while not (metrics.exists() and metrics.read_text().strip()):
            if time.monotonic() - started > 600:
                logs = subprocess.run([*compose, "logs", "train"], capture_output=True, text=True).stdout
                raise SystemExit(f"no training step after 600 s; logs:\n{logs[-3000:]}")
            time.sleep(0.02)
        elapsed = time.monotonic() - started
        first = json.loads(metrics.read_text().splitlines()[0])
        return elapsed, float(first["step_time_s"])
    finally:
        subprocess.run([*compose, "down", "--timeout", "5"], capture_output=True)
        shutil.rmtree(output, ignore_errors=True)


def project(folder: Path, image: str, cpu: bool, name: str) -> list[str]:
    (folder / "data").mkdir()
    (folder / "data" / "corpus.txt").write_text("The quick brown fox jumps over the lazy dog.\n" * 400)
    env = {
        **SETTINGS,
        "TRAINKIT_UID": str(os.getuid()),
        "TRAINKIT_GID": str(os.getgid()),
        "TRAINKIT_CPU_IMAGE" if cpu else "TRAINKIT_IMAGE": image,
        "TRAINKIT_CACHE_VOLUME": f"{name}-cache",
    }
    (folder / ".env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    files = ["-f", str(ROOT / "docker-compose.yml")]
    if cpu:
        files += ["-f", str(ROOT / "docker-compose.cpu.yml")]
    return ["docker", "compose", "-p", name, "--project-directory", str(folder), *files]


def engine_has_gpus() -> bool:
    info = subprocess.run(["docker", "info", "--format", "{{json .Runtimes}}"], capture_output=True, text=True)
    return "nvidia" in info.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="the CPU flavor (default without the NVIDIA runtime)")
    parser.add_argument("--image", help="image to measure (default: the matrix's default for the flavor)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    cpu = args.cpu or not engine_has_gpus()
    from matrix import default_image

    image = args.image or default_image(gpu=not cpu)
    name = f"tkbench{uuid.uuid4().hex[:8]}"
    rows: dict[str, list[float]] = {"floor": [], "compose_floor": [], "imports": [], "up": [], "step": []}
    with tempfile.TemporaryDirectory(prefix="trainkit-startup-") as tmp:
        compose = project(Path(tmp), image, cpu, name)
        docker_run_seconds(image, "pass")  # warm the image's layers into the page cache, unmeasured
        try:
            for index in range(args.repeat):
                rows["floor"].append(docker_run_seconds(image, "pass"))
                rows["imports"].append(docker_run_seconds(image, IMPORTS))
                rows["compose_floor"].append(compose_run_seconds(compose))
                up, step = compose_seconds(Path(tmp), compose)
                rows["up"].append(up)
                rows["step"].append(step)
                print(f"run {index + 1}: docker run python -c pass {rows['floor'][-1]:.2f} s, "
                      f"compose up -> first step {up:.2f} s (the step itself {step:.2f} s)", flush=True)  # fmt: skip
        finally:
            subprocess.run([*compose, "down", "--volumes", "--timeout", "5"], capture_output=True)
    report(image, cpu, args.repeat, {key: statistics.median(values) for key, values in rows.items()})
    return 0


def report(image: str, cpu: bool, repeat: int, median: dict[str, float]) -> None:
    difference = median["up"] - median["floor"]
    verdict = "meets" if difference <= GOAL_S else "misses"
    print(f"\nimage {image} ({'cpu' if cpu else 'gpu'}), median of {repeat}:")
    print(f"  docker run IMAGE python -c pass          {median['floor']:6.2f} s")
    print(f"  docker compose up -> first step          {median['up']:6.2f} s")
    print(f"  difference                               {difference:6.2f} s ({verdict} the goal of <= {GOAL_S:.0f} s)")
    rest = median["up"] - median["imports"] - median["step"]
    print("  where it goes (measured separately, same run):")
    print(f"    docker compose run train python -c pass (compose + entrypoint)    {median['compose_floor']:6.2f} s")
    print(f"    docker run IMAGE python -c '{IMPORTS}'  {median['imports']:6.2f} s")
    print(f"    the first step's own compute                                      {median['step']:6.2f} s")
    print(f"    the rest: launcher, trainer imports beyond those, data/model setup {rest:6.2f} s")


if __name__ == "__main__":
    sys.exit(main())
