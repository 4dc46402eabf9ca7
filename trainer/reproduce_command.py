"""`python -m trainer reproduce OUTPUT_DIR [--steps N] [--output NEW]`: run a finished run again and show where it
differs.

Reads OUTPUT_DIR's provenance.json (trainer.provenance) and run_config.json, checks that every data file and every
user reward file (online RL) still has its recorded sha256 (a changed or missing file is named; exit 2 unless
--allow-changed-data) and that the GPUs are
the recorded ones, then trains again in a subprocess with the TRAIN_* variables the run was started with, into a
staging folder next to NEW (`.tmp-reproduce-NAME`), published by one rename once the comparison is written: an
interrupted reproduce (SIGTERM: the trainer checkpoints and stops) leaves only the staging folder, never a NEW
that looks complete; a second reproduce into the same NEW meanwhile exits 2 naming the first (`.NEW.lock`). The
per-step loss (and, for online RL, the per-step mean reward: COMPARED) is compared with the
original's metrics.jsonl: identical where the run was deterministic (the CPU, or TRAIN_DETERMINISTIC=1), else within
REL_TOLERANCE; the first diverging step with its metric and the recorded inputs that differ (trainer.diff_command's
comparison of the two folders) are printed and written to NEW/reproduce.json. Exit 0 when they agree, EXIT_DIFFERS
when they do not, 2 for a mistake.

The host's `python scripts/run.py reproduce` takes the recorded image by digest and runs this command in it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from trainer.config import run_record
from trainer.config.run_record import RunRecord
from trainer.diff_command import differences, facts
from trainer.errors import EXIT_CRASH, EXIT_DIFFERS, EXIT_OK, EXIT_SIGTERM, ConfigError
from trainer.output_lock import lock_beside
from trainer.provenance import file_sha256, require
from trainer.secrets import MASK

REL_TOLERANCE = 1e-2  # a run that is not deterministic (GPU kernels' order of sums): |a - b| <= 1% of |a|
REPORT_FILE = "reproduce.json"
FIX_DATA = "restore the file(s), or give --allow-changed-data to run on them anyway and see where the loss differs"
COMPARED = ("loss", "reward")  # what each logged step is compared on, where the original logged it (reward: online RL)


def register(parser: argparse.ArgumentParser) -> None:
    """`reproduce`'s arguments, on the parser trainer/__main__.py made for it (trainer/commands.py)."""
    parser.description = (
        "Re-run OUTPUT_DIR's first N steps with its recorded TRAIN_* settings into a new folder (staged, "
        "published when complete) after checking its data and reward files' sha256 and its GPUs, then compare the "
        "loss (and the reward of online RL) of every step: identical for a deterministic run (CPU or "
        f"TRAIN_DETERMINISTIC=1), else within {REL_TOLERANCE:.0%}. Prints the first diverging step, its metric and "
        f"which recorded inputs differ. Exit 0: the steps agree; {EXIT_DIFFERS}: they differ; 2: a mistake (no "
        "provenance, changed data or reward files, other GPUs)."
    )
    parser.add_argument("output_dir", type=Path, metavar="OUTPUT_DIR", help="a finished run's output folder")
    parser.add_argument("--steps", type=int, help="re-run only the first N steps (default: all of them)")
    parser.add_argument("--output", type=Path, help="the new folder (default: OUTPUT_DIR-reproduce)")
    parser.add_argument("--replace", action="store_true", help="replace a non-empty --output")
    parser.add_argument("--allow-changed-data", action="store_true",
                        help="run although a data or reward file differs from its recorded sha256 (or is missing)")
    parser.add_argument("--allow-other-gpus", action="store_true",
                        help="run on other GPUs (or none) than the run recorded; the loss is compared within the "
                        "tolerance")  # fmt: skip
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    original = Path(args.output_dir)
    recorded = recorded_run(original)
    losses = recorded_losses(original)
    steps = wanted_steps(args.steps, losses)
    out = args.output or original.with_name(f"{original.name}-reproduce")
    lock_beside(out, "reproduce")  # a second reproduce into NEW would remove the first's staging folder
    check_destination(out, args.replace)
    changed = changed_data(recorded["provenance"])
    if changed and not args.allow_changed_data:
        raise ConfigError("the inputs differ from what the run recorded: " + "; ".join(changed) + f". {FIX_DATA}")
    gpus_now = current_gpus()
    gpus_then = (recorded["provenance"].get("accelerator") or {}).get("gpus") or []
    same_gpus = sorted(gpus_now) == sorted(gpus_then)
    if not same_gpus and not args.allow_other_gpus:
        raise ConfigError(
            f"the run was made on {describe_gpus(gpus_then)}, this machine has {describe_gpus(gpus_now)}: run it "
            "where the same GPUs are, or give --allow-other-gpus to compare within the tolerance"
        )
    for line in changed:
        print(f"warning: {line} (--allow-changed-data)", flush=True)
    staging = out.parent / f".tmp-reproduce-{out.name}"
    shutil.rmtree(staging, ignore_errors=True)
    code, interrupted, stopped = train_again(run_environment(recorded["run"], staging), staging, steps,
                                             max(losses))  # fmt: skip
    if interrupted:
        print(f"reproduce stopped: {staging} is unfinished and {out} was not written", file=sys.stderr)
        return EXIT_SIGTERM
    if code != EXIT_OK and not (stopped and max(recorded_losses(staging), default=0) >= steps):
        print(f"error: the re-run failed (exit {code}) before its comparison; its output is in {staging}",
              file=sys.stderr)
        return code if code > 0 else EXIT_CRASH
    exact = deterministic(recorded) and same_gpus  # other GPUs: other kernels, compared within the tolerance
    report = compare(original, staging, recorded_metrics(original), recorded_metrics(staging), steps, exact)
    show(report, out)
    (staging / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    publish(staging, out)
    return EXIT_OK if report["identical"] else EXIT_DIFFERS


def recorded_run(folder: Path) -> dict[str, Any]:
    """The run's provenance and its record (trainer.config.run_record); ConfigError naming what is missing."""
    provenance = require(folder, "it cannot be reproduced exactly, run it again with this version")
    return {"provenance": provenance, "run": run_record.require(folder, "reproduce")}


def recorded_losses(folder: Path) -> dict[int, float | None]:
    """step -> the training loss logged at it (metrics.jsonl; None for a non-finite loss)."""
    return {step: metrics["loss"] for step, metrics in recorded_metrics(folder).items()}


def recorded_metrics(folder: Path) -> dict[int, dict[str, float | None]]:
    """step -> the COMPARED metrics logged with its training loss (metrics.jsonl; None for a non-finite value)."""
    found: dict[int, dict[str, float | None]] = {}
    try:
        lines = (folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut by a crash
        if isinstance(record, dict) and "loss" in record and isinstance(record.get("step"), int):
            found[record["step"]] = {name: number(record[name]) for name in COMPARED if name in record}
    return found


def number(value: Any) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def wanted_steps(steps: int | None, losses: dict[int, Any]) -> int:
    if not losses:
        raise ConfigError("the run logged no loss (metrics.jsonl is missing or empty): there is nothing to compare")
    last = max(losses)
    if steps is None:
        return last
    if not 1 <= steps <= last:
        raise ConfigError(f"--steps {steps}: the run logged steps 1 to {last}; give a number in that range")
    return steps


def check_destination(out: Path, replace: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--output {out}: a file is in the way; give a folder")
    if out.is_dir() and any(out.iterdir()) and not replace:
        raise ConfigError(f"--output {out}: the folder is not empty; give a new folder or --replace (nothing was "
                          "overwritten)")  # fmt: skip


def changed_data(provenance: dict[str, Any]) -> list[str]:
    """One line per recorded data file, user reward file or tool/environment file (online RL) that is missing or
    whose content's sha256 is not the recorded one."""
    data = {path: entry.get("sha256") if isinstance(entry, dict) else None
            for path, entry in (provenance.get("data") or {}).items()}  # fmt: skip
    online = provenance.get("online_rl") or {}
    return [*changed_files(data, ""), *changed_files(online.get("reward_files") or {}, "the reward file "),
            *changed_files(online.get("tool_files") or {}, "the tool file ")]  # fmt: skip


def changed_files(recorded: dict[str, str | None], kind: str) -> list[str]:
    found = []
    for path, sha256 in recorded.items():
        if not Path(path).is_file():
            found.append(f"{kind}{path} is missing")
        elif sha256 is not None and file_sha256(Path(path)) != sha256:
            found.append(f"{kind}{path} changed (its sha256 is not the recorded {sha256})")
    return found


def current_gpus() -> list[str]:
    """This machine's GPU models, as nvidia-smi names them (none without it); no torch in this process."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30, check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def describe_gpus(gpus: list[str]) -> str:
    return ", ".join(gpus) if gpus else "no GPU (the CPU)"


def deterministic(recorded: dict[str, Any]) -> bool:
    """The CPU, or TRAIN_DETERMINISTIC=1: the loss of every step must be identical."""
    flag = recorded["run"].settings.deterministic
    return not (recorded["provenance"].get("accelerator") or {}).get("gpus") or flag is True


def run_environment(run: RunRecord, staging: Path) -> dict[str, str]:
    """This process's environment without its TRAIN_*, plus the TRAIN_* the run was started with, writing into
    `staging`. A value the record masked (a secret inside TRAIN_ARGS) is taken from this environment."""
    given = run.started_with()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAIN_")}
    for name, value in given.items():
        if MASK in str(value):
            if name not in os.environ:
                raise ConfigError(f"{name} held a secret, masked in run_config.json: set {name} again to reproduce")
            value = os.environ[name]
        env[name] = str(value)
    env["TRAIN_OUTPUT_DIR"] = str(staging)
    return env


def train_again(env: dict[str, str], staging: Path, steps: int, last: int, poll_s: float = 0.5
                ) -> tuple[int, bool, bool]:  # fmt: skip
    """`python -m trainer train` with `env`: (its exit code, whether a SIGTERM to this process stopped it, whether
    this function stopped it). Once it logged step `steps`, when that is before the run's `last`, it is stopped
    gracefully (SIGTERM: it checkpoints; one that arrives as it exits may end it: the steps are logged by then)."""
    child = subprocess.Popen([sys.executable, "-m", "trainer", "train"], env=env)
    interrupted = []

    def forward(signum: int, _frame: Any) -> None:
        interrupted.append(signum)
        if child.poll() is None:
            child.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    asked = False
    try:
        while child.poll() is None:
            if steps < last and not asked and max(recorded_losses(staging), default=0) >= steps:
                child.send_signal(signal.SIGTERM)  # the steps asked for are logged: stop after a checkpoint
                asked = True
            time.sleep(poll_s)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return child.wait(), bool(interrupted), asked


def same_value(a: float | None, b: float | None, exact: bool) -> bool:
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return a is b or (a is not None and b is not None and str(a) == str(b))
    return a == b if exact else abs(a - b) <= REL_TOLERANCE * max(abs(a), 1e-12)


def compare(original: Path, again: Path, before: dict[int, dict[str, Any]], after: dict[int, dict[str, Any]],
            steps: int, exact: bool) -> dict[str, Any]:  # fmt: skip
    """The report: the steps and metrics compared, the first step that differs (its metric, both values), and the
    recorded inputs that differ between the two folders (provenance and settings, as `trainer diff` compares them)."""
    compared = [s for s in sorted(before) if s <= steps]
    inputs = [{"what": k, "original": a, "again": b} for k, a, b in differences(facts(original), facts(again))]
    first = first_difference(before, after, compared, exact)
    return {
        "original": str(original), "steps": len(compared), "last_step": steps,
        "metrics": [name for name in COMPARED if any(name in before[s] for s in compared)],
        "rule": "identical" if exact else f"within {REL_TOLERANCE:.0%} (relative)",
        "identical": first is None, "first_difference": first, "inputs_that_differ": inputs,
    }  # fmt: skip


def first_difference(before: dict[int, dict[str, Any]], after: dict[int, dict[str, Any]], compared: list[int],
                     exact: bool) -> dict[str, Any] | None:  # fmt: skip
    """The first step (in COMPARED's order within it) whose metric the re-run did not log or logged otherwise."""
    for step in compared:
        again = after.get(step, {})
        for name, value in before[step].items():
            if name not in again or not same_value(value, again[name], exact):
                return {"step": step, "metric": name, "original": value, "again": again.get(name)}
    return None


def show(report: dict[str, Any], out: Path) -> None:
    rule, steps = report["rule"], report["steps"]
    metrics = " and ".join(report["metrics"]) or "loss"
    if report["identical"]:
        verb = "are" if len(report["metrics"]) > 1 else "is"
        print(f"reproduced: the {metrics} of all {steps} logged steps {verb} {rule} to the original's ({out})")
    else:
        first = report["first_difference"]
        print(f"differs: step {first['step']} has {first['metric']} {first['again']}, the original "
              f"{first['original']} (rule: {rule}; the {metrics} of {steps} logged steps compared; {out})")  # fmt: skip
    inputs = report["inputs_that_differ"]
    names = ", ".join(row["what"] for row in inputs)
    print(f"recorded inputs that differ: {names}" if inputs else "recorded inputs that differ: none")
    sys.stdout.flush()


def publish(staging: Path, out: Path) -> None:
    """The complete folder under its name, in one rename."""
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    os.rename(staging, out)
