"""`python -m trainer bench`: measure what each technique buys here, and recommend the fastest that fits.

Every row is a separate `python -m trainer.launch train` subprocess (a crash or an out-of-memory in one
row never stops the table). Precision rows run first; the other rows run on top of the fastest precision,
and `combined` stacks the winners. Results go to TRAIN_OUTPUT_DIR/bench/.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import sys
from pathlib import Path

from trainer.bench.catalogue import BASELINE, UnknownRowError, catalogue, select_rows
from trainer.bench.machine import machine, versions
from trainer.bench.report import BenchProgress, BenchResult, fastest_row, fill_relative, print_summary, write_reports
from trainer.bench.resume import earlier_rows
from trainer.bench.runner import RunPlan
from trainer.bench.session import Bench, Context, recommendable, recommended_env
from trainer.config.moe import grouped_mm_problem, moe_of_model
from trainer.config.schema import TrainSettings
from trainer.errors import ConfigError, exit_code_for_signal, signal_of_exit_code
from trainer.hub.sources import hub_ref

# ---- command line ---------------------------------------------------------------------------------

def register(parser: argparse.ArgumentParser) -> None:
    """`bench`'s arguments, on the parser trainer/__main__.py made for it (trainer/commands.py)."""
    parser.description = (
        "Measure each training technique on this machine with the configured TRAIN_* model and data, "
        "and recommend the fastest configuration that fits. Results go to TRAIN_OUTPUT_DIR/bench/."
    )
    parser.add_argument("--rows", help="comma-separated rows or groups to run (default: all; see --list); "
                        "the fp32 baseline always runs")
    parser.add_argument("--steps", type=_positive_int, default=12, help="measured steps per row (default 12)")
    parser.add_argument("--warmup", type=_non_negative_int, default=4,
                        help="warm-up steps per row, excluded from the medians (default 4)")
    parser.add_argument("--row-timeout", type=_positive_int, default=1800, metavar="SECONDS",
                        help="stop a row that runs longer than this (default 1800)")
    parser.add_argument("--max-batch", type=_positive_int, default=1024,
                        help="upper bound for the largest-batch probe (default 1024)")
    parser.add_argument("--time-limit", type=_positive_int, metavar="SECONDS",
                        help="start no row after this many seconds; the same command again measures the rest")
    parser.add_argument("--fresh", action="store_true",
                        help="measure every selected row again (default: keep the rows results.json holds for the "
                        "same model, data, sequence length, batch, steps, device and versions)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    parser.add_argument("--list", action="store_true", help="list the rows and exit")
    parser.set_defaults(func=main)


def _positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def print_row_list() -> None:
    for spec in catalogue():
        print(f"{spec.name:20} {spec.group:10} {spec.description}")


# ---- configuration ----------------------------------------------------------------------------------

def load_settings() -> TrainSettings:
    """The user's TRAIN_* settings (names and values checked as `train` checks them), else a ConfigError."""
    from trainer.config import parse_settings

    return parse_settings()


def bench_dir_for(output_dir: str) -> Path:
    """TRAIN_OUTPUT_DIR/bench, created; a ConfigError when it cannot be written."""
    path = Path(output_dir) / "bench"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"cannot write bench results to {path} ({exc.strerror}): set TRAIN_OUTPUT_DIR to a "
                          "writable folder (in the container, mount one at /output)") from None
    return path


# ---- entry point -----------------------------------------------------------------------------------

def busy_note(load_before: float | None) -> str:
    """The 1-minute load average before the bench, flagged when other processes already kept the cores busy."""
    if load_before is None:
        return "unknown"
    cores = os.cpu_count() or 1
    note = f"{load_before:.2f} on {cores} cores"
    return note + (" (other processes were busy: expect noisy numbers)" if load_before >= cores / 2 else "")


def build_meta(settings: TrainSettings, info: dict, plan: RunPlan, argv: list[str], load_before: float | None) -> dict:
    return {
        "load_before": busy_note(load_before),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": info["device"],
        "on_gpu": info["on_gpu"],
        "memory": "peak GPU memory allocated" if info["on_gpu"] else "peak resident memory of the process (RSS)",
        "versions": versions(info["torch"]),
        "model": settings.model,
        "seq_len": settings.seq_len,
        "batch_size": settings.batch_size,
        "data": settings.data,
        "warmup": plan.warmup,
        "steps": plan.steps,
        "command": "python -m trainer bench " + " ".join(argv),
    }


class Interrupted(BaseException):
    """SIGTERM (docker stop): unwinds like Ctrl-C, so the running row is stopped and the results so far written."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_interrupted(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


def measure_rows(bench: Bench, total: int) -> int:
    """Run every row; returns 0, or 128+N when signal N interrupted the bench (the rows so far are kept)."""
    try:
        with BenchProgress(total) as ui:
            bench.ui = ui
            bench.run()
    except KeyboardInterrupt:
        return exit_code_for_signal(signal.SIGINT)
    except Interrupted as exc:
        return exit_code_for_signal(exc.signum)
    return 0


def report(result: BenchResult, work_dir: Path, as_json: bool) -> None:
    fill_relative(result)
    best = fastest_row(recommendable(result.rows))
    if best is not None:
        result.recommended, result.recommended_env = best.name, recommended_env(best)
    paths = write_reports(result, work_dir)
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print_summary(result, paths)


def moe_problem(model: str) -> str:
    """Why the moe rows cannot run with TRAIN_MODEL ('' where they can)."""
    from trainer import compat

    if moe_of_model(model) is None:
        return (f"TRAIN_MODEL={model} is no mixture of experts (a preset such as tiny-moe, or a local model folder "
                "with routed experts)")  # fmt: skip
    if not compat.stack().transformers_5:
        return f"{compat.stack().describe()} keeps one module per expert (no experts implementations)"
    return ""


def run(args: argparse.Namespace, argv: list[str]) -> int:
    if args.list:
        print_row_list()
        return 0
    try:
        specs = select_rows(args.rows)
    except UnknownRowError as exc:
        raise ConfigError(str(exc)) from None
    settings = load_settings()
    work_dir = bench_dir_for(settings.output_dir)
    info = machine()
    pretrained = Path(settings.model).is_dir() or hub_ref(settings.model) is not None  # a folder or a Hub ID
    ctx = Context(settings.model, pretrained, settings.seq_len, settings.batch_size,
                  info["on_gpu"], args.max_batch, auto_compile=info.get("auto_compile", False),
                  method=settings.method, moe=moe_problem(settings.model),
                  grouped_mm=grouped_mm_problem(info["on_gpu"], info.get("capability")))  # fmt: skip
    plan = RunPlan(args.warmup, args.steps, float(args.row_timeout), work_dir)
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    meta = build_meta(settings, info, plan, argv, load_before)
    earlier, note = earlier_rows(work_dir, meta, args.fresh)
    print(f"bench: {note}", file=sys.stderr)
    bench = Bench(specs, ctx, plan, ui=None, earlier=earlier, time_limit_s=args.time_limit)
    try:
        code = measure_rows(bench, len(specs))
    finally:
        remove_scratch(work_dir)
    if code:
        done = f"{len(bench.results)} of {len(specs)} rows"
        meta["interrupted"] = f"stopped by signal {signal_of_exit_code(code)} after {done}"
        print(f"interrupted: {meta['interrupted']}; writing the results so far", file=sys.stderr)
    if bench.left:
        meta["left"] = f"--time-limit {args.time_limit} s reached; not measured yet: {', '.join(bench.left)}"
        print(f"bench: {meta['left']}; run the same command again to measure them", file=sys.stderr)
    report(BenchResult(meta, BASELINE, bench.ordered()), work_dir, args.json)
    return code


def remove_scratch(work_dir: Path) -> None:
    """The rows' temporary output folders and the shared tokenized-data cache."""
    for name in (".tmp", ".cache"):
        shutil.rmtree(work_dir / name, ignore_errors=True)


def main(args: argparse.Namespace) -> int:
    """`python -m trainer bench [--rows a,b] [--steps N] [--warmup N] [--json]`; returns the exit code."""
    previous = signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        return run(args, args.argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return exit_code_for_signal(signal.SIGINT)
    except Interrupted as exc:
        print("interrupted", file=sys.stderr)
        return exit_code_for_signal(exc.signum)
    finally:
        signal.signal(signal.SIGTERM, previous)
