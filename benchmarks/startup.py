"""Startup overhead: seconds from `docker compose up train` to the first training step, side by side with
`docker run IMAGE python -c pass` (container start + interpreter, the floor) in the same run.

    python -m benchmarks.startup [--cpu] [--repeat 5] [--image IMAGE]
    python -m benchmarks.startup --build [--presets tiny,125m,350m]   # no Docker: the model build on the host

`--build` measures the trainer's own preset build (trainer.model.loading.load), each in a fresh process:
built on the CPU in fp32 (what a GPU run did before: a host copy, then moved), and built where it trains, with the
`meta` device standing in for the GPU (what the host does when the model is built on its GPU: nothing in host
memory, no initialisation on the host). Printed: seconds and the growth of the process's peak resident memory.

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
GOAL_S = 3.0
TORCH = "import torch"
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


def docker_import_seconds(image: str, code: str) -> float:
    """Seconds from `docker run` until `code` has run; unlike the floor, the interpreter's exit is not counted
    (tearing down torch takes a while), just as `up -> first step` does not count the trainer's exit."""
    started = time.monotonic()
    marker = "trainkit-startup-imported"
    command = ["docker", "run", "--rm", image, "python", "-c", f"{code}; print({marker!r}, flush=True)"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as process:
        assert process.stdout is not None
        elapsed = next((time.monotonic() - started for line in process.stdout if line.strip() == marker), None)
        process.stdout.read()
    if process.returncode != 0 or elapsed is None:
        raise SystemExit(f"`docker run {image} python -c '{code}'` failed (exit {process.returncode})")
    return elapsed


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


def default_image(gpu: bool) -> str:
    """The moving tag a user gets, as scripts/matrix.py names it (a host tool, run as one)."""
    flavor = "gpu" if gpu else "cpu"
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "matrix.py"), "--default-image", flavor],
                         capture_output=True, text=True, check=True)  # fmt: skip
    return out.stdout.strip()


BUILD = """
import json, resource, sys, time
from transformers import AutoModelForCausalLM, LlamaConfig  # imported before the clock starts
from trainer.model.loading import LoadHow, Weights, load
from trainer.model.packed_attention import implementation
from trainer.tokenizer import byte_level_tokenizer
preset, device = sys.argv[1:3]
tokenizer = byte_level_tokenizer()
how = LoadHow(attention=implementation("sdpa"), device=device)
peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.perf_counter()
model = load(Weights(preset=preset, tokenizer=tokenizer), how)
seconds = time.perf_counter() - started
growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before
params = sum(p.numel() for p in model.parameters())
print(json.dumps({"seconds": seconds, "rss_growth_mib": growth / 1024, "params": params}))
"""


def build_seconds(preset: str, device: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    done = subprocess.run([sys.executable, "-c", BUILD, preset, device], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"building {preset} on {device} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def build_report(presets: list[str], repeat: int) -> None:
    print(f"preset build (trainer.model.loading.load), median of {repeat}, each in a fresh process:")
    print(f"  {'preset':8} {'parameters':>13}  {'on the CPU, fp32':>26}  {'where it trains (meta)':>26}")
    for preset in presets:
        runs = {device: [build_seconds(preset, device) for _ in range(repeat)] for device in ("cpu", "meta")}
        cells = []
        for device in ("cpu", "meta"):
            seconds = statistics.median(r["seconds"] for r in runs[device])
            growth = statistics.median(r["rss_growth_mib"] for r in runs[device])
            cells.append(f"{seconds:7.2f} s, {growth:8.1f} MiB RSS")
        print(f"  {preset:8} {runs['cpu'][0]['params']:>13,}  {cells[0]:>26}  {cells[1]:>26}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="the CPU flavor (default without the NVIDIA runtime)")
    parser.add_argument("--image", help="image to measure (default: the matrix's default for the flavor)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--build", action="store_true", help="measure the preset build on the host (no Docker)")
    parser.add_argument("--presets", default="tiny,125m,350m", help="presets for --build (default tiny,125m,350m)")
    args = parser.parse_args(argv)
    if args.build:
        build_report(args.presets.split(","), args.repeat)
        return 0
    cpu = args.cpu or not engine_has_gpus()
    image = args.image or default_image(gpu=not cpu)
    name = f"tkbench{uuid.uuid4().hex[:8]}"
    rows: dict[str, list[float]] = {"floor": [], "compose_floor": [], "torch": [], "imports": [], "up": [], "step": []}
    with tempfile.TemporaryDirectory(prefix="trainkit-startup-") as tmp:
        compose = project(Path(tmp), image, cpu, name)
        docker_run_seconds(image, "pass")  # warm the image's layers into the page cache, unmeasured
        try:
            for index in range(args.repeat):
                rows["floor"].append(docker_run_seconds(image, "pass"))
                rows["torch"].append(docker_import_seconds(image, TORCH))
                rows["imports"].append(docker_import_seconds(image, IMPORTS))
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
    floor = median["floor"]
    difference = median["up"] - floor
    compose = median["compose_floor"] - floor
    libraries = median["imports"] - floor
    rest = difference - compose - libraries - median["step"]
    verdict = "meets" if difference <= GOAL_S else "misses"
    print(f"\nimage {image} ({'cpu' if cpu else 'gpu'}), median of {repeat}:")
    print_rows(
        [
            ("docker run IMAGE python -c pass", floor),
            ("docker compose up -> first step", median["up"]),
            (f"difference ({verdict} the goal of <= {GOAL_S:.0f} s)", difference),
        ]
    )
    print("where the difference goes (each part measured separately in this run, less the floor above):")
    print_rows(
        [
            ("compose + entrypoint: docker compose run train python -c pass", compose),
            (f"library imports, docker run to the end of: {TORCH}", median["torch"] - floor),
            (f"library imports, docker run to the end of: {IMPORTS}", libraries),
            ("the first step's own compute", median["step"]),
            ("the rest: launcher, trainkit's modules, data and model set-up", rest),
            ("all but the library imports (compose, entrypoint, rest, first step)", difference - libraries),
        ]
    )
    if rest < 0:
        print("  (the rest is by subtraction: below zero, it is within the noise between the separate runs)")
    if difference > GOAL_S and libraries > GOAL_S:
        print(f"Importing torch and transformers.Trainer alone takes {libraries:.2f} s over the floor here, more than")
        print("the goal by itself: on this machine the goal is set by the pinned libraries, not by trainkit.")


def print_rows(rows: list[tuple[str, float]]) -> None:
    width = max(len(label) for label, _ in rows)
    for label, seconds in rows:
        print(f"  {label:<{width}}  {seconds:6.2f} s")


if __name__ == "__main__":
    sys.exit(main())
