"""Seconds per step of a tiny run alone and with one busy process beside it, by thread setting (issue 69 item 13).

    .venv/bin/python -m benchmarks.contention [--steps 20] [--variants default,threads1,passive]
                                              [--image trainkit:latest-cpu] [--cpus 1] [--out FILE.jsonl]

Each variant trains `python -m trainer` (TRAIN_MODEL=tiny on the embedded corpus, the defaults otherwise) twice: quiet,
and with `yes > /dev/null` pinned to the last usable core (one other busy process, as a second job on a 2-core
machine is). Reported per run: the median `step_time_s` after the first 3 steps, the trainer's CPU seconds per step
over the same steps (user+sys of its whole process group, or of the container's cgroup: a spinning OpenMP thread
shows as CPU burnt while no step goes faster), the threads the run used and the load average before it. On the host by
default; with --image, in that image (`docker run`, --cpus N as a CPU quota, i.e. cgroup cpu.max).

Variants: `default` (what a user gets: no thread variable set, so trainer/machine/threads.py decides), `spin` (as
before that rule: torch's thread count and libgomp's spinning wait), `threads1` (OMP_NUM_THREADS=1), `passive`
(OMP_WAIT_POLICY=PASSIVE alone), each with --repeats rounds that alternate the variants (a shared machine's load
drifts).
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS = {
    "default": {},
    "threads1": {"OMP_NUM_THREADS": "1"},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    # as before trainer/machine/threads.py: nothing decided (its line preset, so it adds nothing), libgomp's own spin
    "spin": {"TRAINKIT_THREADS": "threads: left to torch and libgomp (the benchmark's `spin` variant)"},
}
CLK_TCK = os.sysconf("SC_CLK_TCK")


def busy(core: int) -> subprocess.Popen:
    """`yes > /dev/null` pinned to `core`: one other process keeping one core busy."""
    return subprocess.Popen(["yes"], stdout=subprocess.DEVNULL, preexec_fn=lambda: os.sched_setaffinity(0, {core}))


def group_cpu_s(pgid: int) -> float:
    """User+sys seconds of every live process in process group `pgid`."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after the name: state ppid pgrp ...; utime, stime are 14th, 15th
            total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def container_cpu_s(name: str) -> float:
    """A running container's CPU seconds, from its cgroup (v1 cpuacct or v2 cpu.stat)."""
    full = subprocess.run(["docker", "inspect", "-f", "{{.Id}}", name], capture_output=True, text=True).stdout.strip()
    for path in (f"/sys/fs/cgroup/cpuacct/docker/{full}/cpuacct.usage",
                 f"/sys/fs/cgroup/system.slice/docker-{full}.scope/cpu.stat"):  # fmt: skip
        file = Path(path)
        if file.is_file():
            text = file.read_text()
            if file.name == "cpu.stat":
                return int(text.split("usage_usec")[1].split()[0]) / 1e6
            return int(text) / 1e9
    return float("nan")


def steps_logged(metrics: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError):
        return []


def train_env(out: Path, steps: int, extra: dict[str, str]) -> dict[str, str]:
    return {"TRAIN_MODEL": "tiny", "TRAIN_MAX_STEPS": str(steps), "TRAIN_LOG_STEPS": "1", "TRAIN_SAVE_STEPS": "100000",
            "TRAIN_OUTPUT_DIR": str(out), **extra}  # fmt: skip


def start(args: argparse.Namespace, out: Path, extra: dict[str, str]) -> tuple[subprocess.Popen, str]:
    env = train_env(Path("/output") if args.image else out, args.steps, extra)
    if not args.image:
        keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
        proc = subprocess.Popen([sys.executable, "-m", "trainer"], cwd=REPO, env={**keep, "PYTHONPATH": str(REPO),
                                "HF_HUB_OFFLINE": "1", **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)  # fmt: skip
        return proc, ""
    name = f"contention-{os.getpid()}-{int(time.time())}"
    argv = ["docker", "run", "--rm", "--name", name, "--user", f"{os.getuid()}:{os.getgid()}", "-v", f"{out}:/output"]
    argv += [f"--cpus={args.cpus}"] if args.cpus else []
    argv += [x for k, v in env.items() for x in ("-e", f"{k}={v}")] + [args.image, "train"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), name


def measure(args: argparse.Namespace, variant: str, contended: bool) -> dict:
    """One run: median seconds per step and CPU seconds per step after the first 3 steps. Its output folder (about
    50 MB of checkpoints) is removed after."""
    out = Path(tempfile.mkdtemp(prefix="contention-"))
    try:
        return measure_into(out, args, variant, contended)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def measure_into(out: Path, args: argparse.Namespace, variant: str, contended: bool) -> dict:
    out.chmod(0o777)
    hog = busy(max(os.sched_getaffinity(0))) if contended else None
    load = os.getloadavg()[0]
    proc, container = start(args, out, VARIANTS.get(variant, {}))
    cpu_at: dict[int, float] = {}
    try:
        while proc.poll() is None:
            logged = steps_logged(out / "metrics.jsonl")
            last = logged[-1]["step"] if logged else 0
            if last and last not in cpu_at:
                cpu_at[last] = container_cpu_s(container) if container else group_cpu_s(proc.pid)
            time.sleep(0.05)
    finally:
        if hog:
            hog.kill()
    err = proc.stderr.read() if proc.stderr else ""
    logged = steps_logged(out / "metrics.jsonl")
    if proc.returncode != 0 or len(logged) < args.steps:
        return {"variant": variant, "contended": contended, "error": f"exit {proc.returncode}: {err[-800:]}"}
    times = [line["step_time_s"] for line in logged[3:]]
    first, last = min(k for k in cpu_at if k >= 3), max(cpu_at)
    cpu_per_step = (cpu_at[last] - cpu_at[first]) / (last - first) if last > first else None
    threads = next((line.split("threads:", 1)[1].strip() for line in err.splitlines() if "threads:" in line), "")
    return {"variant": variant, "contended": contended, "where": args.image or "host", "cpus": args.cpus,
            "s_per_step": round(statistics.median(times), 3), "cpu_s_per_step": round(cpu_per_step or 0, 3),
            "steps": len(logged), "load_before": round(load, 2), "threads_log": threads}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--variants", default="default,threads1,passive")
    p.add_argument("--image", help="run in this image (docker run) instead of on the host")
    p.add_argument("--cpus", help="with --image: docker run --cpus (a CPU quota: cgroup cpu.max)")
    p.add_argument("--repeats", type=int, default=1, help="rounds of every variant, alternating (load drifts)")
    p.add_argument("--contended", choices=("both", "yes", "no"), default="both")
    p.add_argument("--out", type=Path, help="append each run's JSON line here")
    args = p.parse_args(argv)
    print(f"machine: {len(os.sched_getaffinity(0))} usable CPUs; load {os.getloadavg()}", flush=True)
    states = {"both": (False, True), "yes": (True,), "no": (False,)}[args.contended]
    for repeat in range(args.repeats):
        for contended in states:
            for variant in args.variants.split(","):
                row = {**measure(args, variant, contended), "repeat": repeat}
                print(json.dumps(row), flush=True)
                if args.out:
                    with args.out.open("a") as f:
                        f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
