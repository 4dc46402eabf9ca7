"""Startup overhead: seconds from `docker compose up train` to the first training step, side by side with
`docker run IMAGE python -c pass` (container start + interpreter, the floor) in the same run.

    python benchmarks/startup.py [--cpu] [--repeat 3] [--image IMAGE]

The run trains the `tiny` preset (TRAIN_SEQ_LEN=64, one step logged per step) on a small corpus in a
temporary project folder; the first line of output/metrics.jsonl marks the first finished step.
Goal: compose startup at most 3 s above the floor. `--cpu` (the default on engines without the NVIDIA
runtime) layers docker-compose.cpu.yml.
"""

from __future__ import annotations

import argparse
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
SETTINGS = {
    "TRAIN_MODEL": "tiny",
    "TRAIN_SEQ_LEN": "64",
    "TRAIN_BATCH_SIZE": "2",
    "TRAIN_NUM_WORKERS": "0",
    "TRAIN_LOG_STEPS": "1",
    "TRAIN_MAX_STEPS": "2",
    "TRAIN_SAVE_STEPS": "1000",
}


def floor_seconds(image: str) -> float:
    started = time.monotonic()
    subprocess.run(["docker", "run", "--rm", image, "python", "-c", "pass"], check=True, capture_output=True)
    return time.monotonic() - started


def compose_seconds(folder: Path, compose: list[str]) -> float:
    """Seconds from `up` to the first metrics line; the run is then taken down."""
    output = folder / "output"
    output.mkdir()
    metrics = output / "metrics.jsonl"
    started = time.monotonic()
    proc = subprocess.Popen([*compose, "up", "--detach", "train"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while not (metrics.exists() and metrics.read_text().strip()):
            if proc.poll() not in (None, 0):
                raise SystemExit(f"`docker compose up` failed: {proc.stderr.read().decode()[-2000:]}")
            if time.monotonic() - started > 600:
                logs = subprocess.run([*compose, "logs", "train"], capture_output=True, text=True).stdout
                raise SystemExit(f"no training step after 600 s; logs:\n{logs[-3000:]}")
            time.sleep(0.02)
        return time.monotonic() - started
    finally:
        proc.wait()
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
    floors, ups = [], []
    with tempfile.TemporaryDirectory(prefix="trainkit-startup-") as tmp:
        compose = project(Path(tmp), image, cpu, name)
        floor_seconds(image)  # warm the image's layers into the page cache, unmeasured
        try:
            for index in range(args.repeat):
                floors.append(floor_seconds(image))
                ups.append(compose_seconds(Path(tmp), compose))
                print(f"run {index + 1}: docker run python -c pass {floors[-1]:.2f} s, "
                      f"compose up -> first step {ups[-1]:.2f} s", flush=True)  # fmt: skip
        finally:
            subprocess.run([*compose, "down", "--volumes", "--timeout", "5"], capture_output=True)
    floor, up = statistics.median(floors), statistics.median(ups)
    verdict = "meets" if up - floor <= GOAL_S else "misses"
    print(f"\nimage {image} ({'cpu' if cpu else 'gpu'}), median of {args.repeat}:")
    print(f"  docker run IMAGE python -c pass   {floor:6.2f} s")
    print(f"  docker compose up -> first step   {up:6.2f} s")
    print(f"  difference                        {up - floor:6.2f} s ({verdict} the goal of <= {GOAL_S:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
