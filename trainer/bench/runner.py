"""Run one bench row: a `python -m trainer.launch train` subprocess, then read back what it measured.

A row that fails never raises: it comes back as a status (skipped, oom, error) with a reason.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from trainer.bench.catalogue import UNSET
from trainer.run.rollout_timing import GENERATION_KEY

OK, SKIPPED, OOM, ERROR = "ok", "skipped", "oom", "error"

_OOM_PATTERNS = re.compile(
    r"out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED", re.IGNORECASE
)
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b.*")
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?")  # torchrun's per-worker line prefix (trainer.launch sets it)
_TERMINATE_GRACE_S = 30


@dataclass(frozen=True)
class Measured:
    tokens_per_s: float
    samples_per_s: float | None
    step_time_s: float | None
    mfu: float | None
    peak_mem_bytes: int | None
    measured_steps: int
    generation_s: float | None = None  # online RL: of step_time_s, producing the completions (GENERATION_KEY)
    loss: float | None = None  # the mean training loss of the measured steps (fp8 against bf16)


@dataclass(frozen=True)
class RowOutcome:
    status: str
    reason: str = ""
    measured: Measured | None = None
    wall_s: float = 0.0


@dataclass(frozen=True)
class RunPlan:
    """How each row subprocess runs: step counts, the per-row time limit and where its logs go."""

    warmup: int
    steps: int
    timeout_s: float
    work_dir: Path

    @property
    def max_steps(self) -> int:
        return self.warmup + self.steps

    @property
    def log_steps(self) -> int:
        """Steps per metrics line: each line is the mean of its steps, and costs one host-device sync (the trainer
        reads the loss), so lines come as rarely as the warm-up and measured steps allow (both whole lines)."""
        return math.gcd(self.warmup, self.steps) or 1


StepCallback = Callable[[int], None]


def run_controls(plan: RunPlan, output_dir: Path) -> dict[str, str]:
    """TRAIN_* values every row gets: a fresh output folder, no resume, a log line per step, no checkpoint."""
    return {
        "TRAIN_OUTPUT_DIR": str(output_dir),
        "TRAIN_MAX_STEPS": str(plan.max_steps),
        "TRAIN_LOG_STEPS": str(plan.log_steps),
        "TRAIN_SAVE_STEPS": str(plan.max_steps + 1_000_000),
        "TRAIN_RESUME": "never",
        "TRAIN_PROFILE": "0",
        "TRAIN_MEMORY_SNAPSHOT": "0",
    }


def child_environment(env: Mapping[str, str], plan: RunPlan, output_dir: Path) -> dict[str, str]:
    """The row's variables over this process's, with the run controls; a variable the row marks UNSET is removed
    (the `auto` row's TRAIN_BATCH_SIZE: the batch search chooses it, as for a user who sets none). A row that sets
    TRAIN_PROFILE keeps it (benchmarks/gpu_run.py's profile part)."""
    controls = {k: v for k, v in run_controls(plan, output_dir).items() if not (k == "TRAIN_PROFILE" and k in env)}
    merged = {**os.environ, **env, **controls, "PYTHONUNBUFFERED": "1"}
    return {key: value for key, value in merged.items() if value != UNSET}


def row_dir(plan: RunPlan, name: str) -> Path:
    """Where a row's logs, metrics.jsonl and run_config.json are kept."""
    return plan.work_dir / "rows" / name


def run_row(name: str, env: Mapping[str, str], plan: RunPlan, on_step: StepCallback | None = None) -> RowOutcome:
    """Train `plan.max_steps` steps with `env` over the current environment; logs land in work_dir/rows/<name>."""
    from trainer.config import run_record

    log_dir = row_dir(plan, name)
    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True)
    tmp_root = plan.work_dir / ".tmp"
    tmp_root.mkdir(exist_ok=True)
    output_dir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=tmp_root))
    share_data_cache(output_dir, plan.work_dir)
    try:
        child_env = child_environment(env, plan, output_dir)
        started = time.monotonic()
        returncode, timed_out = _run_trainer(child_env, log_dir, output_dir / "metrics.jsonl", plan, on_step)
        wall_s = time.monotonic() - started
        for kept in ("metrics.jsonl", run_record.FILE, "profile/summary-rank0.json"):  # what it decided, measured
            if (output_dir / kept).exists():
                shutil.copyfile(output_dir / kept, log_dir / Path(kept).name)
        stderr = (log_dir / "stderr.log").read_text(errors="replace")
        outcome = classify(returncode, timed_out, stderr, log_dir / "metrics.jsonl", plan)
        return RowOutcome(outcome.status, outcome.reason, outcome.measured, wall_s)
    finally:
        shutil.rmtree(output_dir, ignore_errors=True)


def share_data_cache(output_dir: Path, work_dir: Path) -> None:
    """Point the row's OUTPUT_DIR/.cache at one folder, so rows tokenize the data once, not once each.

    (In the image the trainer caches under /cache instead, which every row shares anyway.)
    """
    shared = work_dir / ".cache"
    shared.mkdir(exist_ok=True)
    (output_dir / ".cache").symlink_to(shared.resolve(), target_is_directory=True)


def _run_trainer(env: dict[str, str], log_dir: Path, metrics: Path, plan: RunPlan,
                 on_step: StepCallback | None) -> tuple[int, bool]:
    """Run the trainer, reporting steps as metrics.jsonl grows; returns (exit code, timed out)."""
    # Through the launcher, as `train` runs in the image: torchrun across the visible GPUs, or one process.
    command = [sys.executable, "-m", "trainer.launch", "train"]
    with open(log_dir / "stdout.log", "wb") as out, open(log_dir / "stderr.log", "wb") as err:
        # A session of its own, so a time-out can stop the trainer and any workers it started.
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=err, start_new_session=True)
        deadline = time.monotonic() + plan.timeout_s
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    _stop(proc)
                    return proc.returncode, True
                if on_step is not None:
                    on_step(_count_lines(metrics) * plan.log_steps)
                time.sleep(0.5)
        except BaseException:
            _stop(proc)
            raise
    return proc.returncode, False


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the row's process group, SIGKILL it if it has not exited after a grace period."""
    for sig, wait_s in ((signal.SIGTERM, _TERMINATE_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _count_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def classify(returncode: int, timed_out: bool, stderr: str, metrics: Path, plan: RunPlan) -> RowOutcome:
    """Turn a finished trainer run into a status, a reason and (when it trained) the measured medians."""
    if timed_out:
        return RowOutcome(ERROR, f"timed out after {plan.timeout_s:.0f} s (raise --row-timeout)")
    if returncode != 0:
        return RowOutcome(*failure_reason(returncode, stderr))
    try:
        return RowOutcome(OK, measured=summarize_metrics(metrics, plan.warmup, plan.log_steps))
    except ValueError as exc:
        return RowOutcome(ERROR, str(exc))


def failure_reason(returncode: int, stderr: str) -> tuple[str, str]:
    """(status, reason) for a trainer that exited non-zero, from its exit code and stderr.

    Under torchrun a worker's exit 2 reaches us as exit 1, so its `error:` line (the trainer prints one
    only for a configuration it refuses) also makes the row a skip.
    """
    raw = [_RANK_PREFIX.sub("", line) for line in stderr.splitlines()]
    lines = [line.strip() for line in raw if line.strip()]
    if returncode == 2 or (returncode > 0 and any(line.startswith("error:") for line in lines)):
        return SKIPPED, _shorten(config_error_message(raw), 500)
    oom_lines = [line for line in lines if _OOM_PATTERNS.search(line)]
    if oom_lines:
        return OOM, _shorten(oom_lines[-1])
    if returncode < 0:
        name = signal.Signals(-returncode).name
        hint = " (the kernel's OOM killer: out of host memory?)" if -returncode == signal.SIGKILL else ""
        return ERROR, f"killed by {name}{hint}"
    return ERROR, f"exit {returncode}: {_shorten(error_line(lines))}"


def config_error_message(lines: list[str]) -> str:
    """The trainer's `error: ...` message, its `  - problem` lines joined on one line."""
    starts = [i for i, line in enumerate(lines) if line.startswith("error:")]
    if not starts:
        rest = [line.strip() for line in lines if line.strip()]
        return rest[-1] if rest else "configuration error (exit 2)"
    first = starts[-1]
    message = [lines[first].removeprefix("error:").strip()]
    for line in lines[first + 1:]:
        if not line.strip().startswith("- "):
            break
        message.append(line.strip().removeprefix("- "))
    return " ".join([message[0], "; ".join(message[1:])]) if len(message) > 1 else message[0]


def error_line(lines: list[str]) -> str:
    """The first line of the last exception in a traceback, else the last line printed."""
    for line in reversed(lines):
        if _EXCEPTION_LINE.match(line) or line.startswith("error:"):
            return line
    return lines[-1] if lines else "no error message"


def _shorten(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_metrics(path: Path) -> list[dict]:
    """The JSON objects of a metrics.jsonl; a torn last line (a killed writer) is ignored."""
    records = []
    if not path.exists():
        return records
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def summarize_metrics(path: Path, warmup: int, log_steps: int = 1) -> Measured:
    """Medians over the lines after the warm-up (each the mean of `log_steps` steps); peak memory is the maximum.
    ValueError if nothing was measured."""
    steps = [r for r in read_metrics(path) if r.get("tokens_per_s") is not None and _step(r) > warmup]
    if not steps:
        raise ValueError(f"the trainer exited 0 but {path.name} has no logged step after the {warmup} warm-up steps")
    peaks = [int(r["peak_mem_bytes"]) for r in steps if r.get("peak_mem_bytes") is not None]
    losses = [float(r["loss"]) for r in steps if r.get("loss") is not None]
    return Measured(
        tokens_per_s=statistics.median(float(r["tokens_per_s"]) for r in steps),
        samples_per_s=_median_of(steps, "samples_per_s"),
        step_time_s=_median_of(steps, "step_time_s"),
        mfu=_median_of(steps, "mfu"),
        peak_mem_bytes=max(peaks) if peaks else None,
        measured_steps=len(steps) * log_steps,
        generation_s=_median_of(steps, GENERATION_KEY),
        loss=statistics.fmean(losses) if losses else None,
    )


def _step(record: dict) -> int:
    try:
        return int(record.get("step", 0))
    except (TypeError, ValueError):
        return 0


def _median_of(records: list[dict], key: str) -> float | None:
    values = [float(r[key]) for r in records if r.get(key) is not None]
    return statistics.median(values) if values else None
