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
import platform
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from trainer.bench_exec import OK, SKIPPED, RowOutcome, RunPlan, error_line, run_row
from trainer.bench_report import (
    BenchProgress,
    BenchResult,
    RowResult,
    fastest_row,
    fill_relative,
    print_summary,
    write_reports,
)
from trainer.bench_rows import (
    ADAPTER_ROWS,
    BASELINE,
    BASELINE_ENV,
    COMBINABLE_GROUPS,
    COMBINED,
    GRAD_ACCUM,
    MAX_BATCH,
    RowSpec,
    UnknownRowError,
    catalogue,
    select_rows,
)
from trainer.errors import EXIT_USER, ConfigError
from trainer.schema import TrainSettings


@dataclass(frozen=True)
class Context:
    """What the rows need to know about the user's configuration and this machine."""

    model: str
    model_is_folder: bool
    seq_len: int
    batch_size: int
    on_gpu: bool
    max_batch: int


# ---- command line ---------------------------------------------------------------------------------

def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m trainer bench",
        description="Measure each training technique on this machine with the configured TRAIN_* model and data, "
        "and recommend the fastest configuration that fits. Results go to TRAIN_OUTPUT_DIR/bench/.",
    )
    parser.add_argument("--rows", help="comma-separated rows or groups to run (default: all; see --list); "
                        "the fp32 baseline always runs")
    parser.add_argument("--steps", type=_positive_int, default=10, help="measured steps per row (default 10)")
    parser.add_argument("--warmup", type=_non_negative_int, default=3,
                        help="warm-up steps per row, excluded from the medians (default 3)")
    parser.add_argument("--row-timeout", type=_positive_int, default=1800, metavar="SECONDS",
                        help="stop a row that runs longer than this (default 1800)")
    parser.add_argument("--max-batch", type=_positive_int, default=1024,
                        help="upper bound for the largest-batch probe (default 1024)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    parser.add_argument("--list", action="store_true", help="list the rows and exit")
    return parser.parse_args(argv)


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


def machine() -> dict:
    """Device and versions for the report, probed in a child process.

    Probing here would create a CUDA context in this process, holding GPU memory the rows then lack.
    """
    code = "import json; from trainer.bench import describe_machine; print(json.dumps(describe_machine()))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        first = error_line([line for line in proc.stderr.splitlines() if line.strip()])
        print(f"warning: could not probe the hardware ({first}); assuming no GPU", file=sys.stderr)
        return {"on_gpu": False, "device": "unknown (hardware probe failed)", "torch": "?"}


def describe_machine() -> dict:
    """Run in a child by machine(): what the report says about this machine."""
    from trainer.hardware import probe

    hw = probe()
    device = hw.describe() if hw.is_gpu else f"CPU: {_cpu_name()}, {hw.cpu_count} cores"
    if hw.is_gpu and hw.cuda_version:
        device += f", CUDA {hw.cuda_version}"
    return {"on_gpu": hw.is_gpu, "device": device, "torch": hw.torch_version}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions(torch_version: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    parts = [f"python {platform.python_version()}", f"torch {torch_version}"]
    for package in ("transformers", "accelerate", "deepspeed", "peft", "flash-attn", "bitsandbytes"):
        try:
            parts.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            continue
    return ", ".join(parts)


# ---- running the rows ----------------------------------------------------------------------------

class Bench:
    """Runs the selected rows in order, keeping each result and the reference the next rows build on."""

    def __init__(self, specs: list[RowSpec], ctx: Context, plan: RunPlan, ui: BenchProgress | None) -> None:
        self.specs = specs
        self.ctx = ctx
        self.plan = plan
        self.ui = ui
        self.results: dict[str, RowResult] = {}

    # The reference for non-precision rows: the fastest precision row that ran (else the baseline).
    def reference(self) -> RowResult | None:
        ran = [r for r in self.results.values() if r.group == "precision" and r.ok]
        if ran:
            return max(ran, key=lambda r: r.tokens_per_s or 0.0)
        return self.results.get(BASELINE)

    def reference_env(self) -> dict[str, str]:
        ref = self.reference()
        if ref is not None and ref.ok:
            return dict(ref.env)
        return {**BASELINE_ENV, "TRAIN_BATCH_SIZE": str(self.ctx.batch_size)}

    def run(self) -> list[RowResult]:
        for spec in self.specs:
            result = self.run_spec(spec)
            self.results[spec.name] = result
            if self.ui:
                self.ui.row_done(result)
            if spec.name == BASELINE and result.status == SKIPPED:
                raise ConfigError(f"the baseline row cannot run with this configuration: {result.reason}")
        return list(self.results.values())

    def run_spec(self, spec: RowSpec) -> RowResult:
        if spec.group == "precision":
            return self.measure(spec, {**BASELINE_ENV, "TRAIN_BATCH_SIZE": str(self.ctx.batch_size), **spec.env},
                                on_top_of=None if spec.name == BASELINE else BASELINE)
        ref = self.reference()
        on_top_of = ref.name if ref else BASELINE
        skip = self.skip_reason(spec)
        if skip:
            return self.skipped(spec, skip, on_top_of)
        if spec.name == MAX_BATCH:
            return self.probe_max_batch(spec, on_top_of)
        if spec.name == COMBINED:
            return self.run_combined(spec, on_top_of)
        env = {**self.reference_env(), **spec.env}
        if spec.name == GRAD_ACCUM:
            env.update(grad_accum_env(self.ctx.batch_size))
        return self.measure(spec, env, on_top_of)

    def skip_reason(self, spec: RowSpec) -> str:
        """Why a row cannot apply here, known without starting the trainer ('' when it may run)."""
        if spec.name in ADAPTER_ROWS and not self.ctx.model_is_folder:
            return (f"needs a pretrained model: TRAIN_MODEL={self.ctx.model} is a preset; "
                    "set it to a Hugging Face model folder to measure LoRA/QLoRA")
        if spec.name == GRAD_ACCUM and self.ctx.batch_size < 2:
            return "needs TRAIN_BATCH_SIZE of 2 or more to split into accumulation steps"
        if spec.name == MAX_BATCH and not self.ctx.on_gpu:
            return "not supported here: the probe doubles the batch until GPU memory runs out (no GPU found)"
        return ""

    def skipped(self, spec: RowSpec, reason: str, on_top_of: str | None) -> RowResult:
        return RowResult(spec.name, spec.group, spec.description, SKIPPED, on_top_of=on_top_of, reason=reason,
                         same_training=spec.same_training)

    def measure(self, spec: RowSpec, env: dict[str, str], on_top_of: str | None, label: str | None = None,
                log_name: str | None = None) -> RowResult:
        """Run a row with `env` (or reuse an identical configuration measured before)."""
        same = next((r for r in self.results.values() if r.ok and r.env == env), None)
        if same is not None:
            return self.as_row(spec, env, on_top_of, measured_from=same)
        on_step = self.ui.start_row(label or spec.name, self.plan.max_steps) if self.ui else None
        outcome = run_row(log_name or spec.name, env, self.plan, on_step)
        return self.as_row(spec, env, on_top_of, outcome=outcome)

    def as_row(self, spec: RowSpec, env: dict[str, str], on_top_of: str | None, outcome: RowOutcome | None = None,
               measured_from: RowResult | None = None) -> RowResult:
        row = RowResult(spec.name, spec.group, spec.description, OK, env=env, changes=changes(env),
                        on_top_of=on_top_of, same_training=spec.same_training)
        if measured_from is not None:
            copy_measurement(measured_from, row)
            row.note = f"same configuration as `{measured_from.name}` (measured once)"
            return row
        assert outcome is not None
        row.status, row.reason, row.wall_s = outcome.status, outcome.reason, outcome.wall_s
        if outcome.measured is not None:
            m = outcome.measured
            row.tokens_per_s, row.samples_per_s, row.step_time_s = m.tokens_per_s, m.samples_per_s, m.step_time_s
            row.mfu, row.peak_mem_bytes, row.measured_steps = m.mfu, m.peak_mem_bytes, m.measured_steps
        return row

    def probe_max_batch(self, spec: RowSpec, on_top_of: str) -> RowResult:
        """Double the micro-batch from twice TRAIN_BATCH_SIZE until a run fails; the row is the largest that ran."""
        best, failed, batch = None, None, self.ctx.batch_size * 2
        while batch <= self.ctx.max_batch:
            env = {**self.reference_env(), "TRAIN_BATCH_SIZE": str(batch)}
            tried = self.measure(spec, env, on_top_of, label=f"{spec.name} (batch {batch})",
                                 log_name=f"{spec.name}-b{batch}")
            if not tried.ok:
                failed = tried
                break
            best, batch = tried, batch * 2
        stop = f"batch {batch}: {failed.status}: {failed.reason}" if failed else f"--max-batch {self.ctx.max_batch}"
        if best is None:
            status = failed.status if failed else SKIPPED
            reason = f"no batch above TRAIN_BATCH_SIZE={self.ctx.batch_size} ran ({stop})"
            return RowResult(spec.name, spec.group, spec.description, status, on_top_of=on_top_of, reason=reason)
        best.note = f"largest batch that ran: {best.env['TRAIN_BATCH_SIZE']} (stopped at {stop})"
        return best

    def run_combined(self, spec: RowSpec, on_top_of: str) -> RowResult:
        plan = self.combined_plan()
        if isinstance(plan, str):
            return self.skipped(spec, plan, on_top_of)
        env, names = plan
        row = self.measure(spec, env, on_top_of)
        row.note = " + ".join(names) + (f"; {row.note}" if row.note else "")
        return row

    def combined_plan(self) -> tuple[dict[str, str], list[str]] | str:
        """(env, the rows it stacks) for the `combined` row, or why there is nothing to combine."""
        ref = self.reference()
        if ref is None or not ref.ok:
            return "no precision row ran, nothing to build on"
        candidates = [self.tf32_winner(ref), *(self.group_winner(group, ref) for group in COMBINABLE_GROUPS)]
        winners = [w for w in candidates if w is not None]
        if not winners:
            return f"no tf32, optimizer, attention, compile or batch row beat `{ref.name}`"
        if len(winners) == 1:
            return f"only `{winners[0].name}` beat `{ref.name}`: nothing to combine"
        env = dict(ref.env)
        for winner in winners:
            env.update(self.own_changes(winner))
        return env, [ref.name, *(w.name for w in winners)]

    def own_changes(self, row: RowResult) -> dict[str, str]:
        """What a row changed over the row it was measured on top of (tf32: TRAIN_TF32=1 only)."""
        base = self.results.get(row.on_top_of or BASELINE)
        base_env = base.env if base is not None and base.ok else self.reference_env()
        return {k: v for k, v in row.env.items() if base_env.get(k) != v}

    def tf32_winner(self, ref: RowResult) -> RowResult | None:
        """The tf32 row when it beat fp32: mixed precision keeps some matmuls in fp32, which TF32 speeds up too."""
        tf32, base = self.results.get("tf32"), self.results.get(BASELINE)
        if ref.name not in ("fp16", "bf16") or tf32 is None or base is None or not (tf32.ok and base.ok):
            return None
        return tf32 if (tf32.tokens_per_s or 0) > (base.tokens_per_s or 0) else None

    def group_winner(self, group: str, ref: RowResult) -> RowResult | None:
        faster = [r for r in self.results.values()
                  if r.group == group and r.ok and r.env != ref.env and (r.tokens_per_s or 0) > (ref.tokens_per_s or 0)]
        return max(faster, key=lambda r: r.tokens_per_s or 0.0, default=None)


def grad_accum_env(batch_size: int) -> dict[str, str]:
    """The same effective batch in smaller micro-batches: the smallest accumulation factor >= 2 dividing it."""
    accum = next(k for k in range(2, batch_size + 1) if batch_size % k == 0)
    return {"TRAIN_BATCH_SIZE": str(batch_size // accum), "TRAIN_GRAD_ACCUM": str(accum)}


def changes(env: dict[str, str]) -> dict[str, str]:
    """What a row's environment changes from the baseline's (TRAIN_BATCH_SIZE is always listed)."""
    return {k: v for k, v in env.items() if BASELINE_ENV.get(k) != v}


def copy_measurement(source: RowResult, target: RowResult) -> None:
    for key in ("tokens_per_s", "samples_per_s", "step_time_s", "mfu", "peak_mem_bytes", "measured_steps"):
        setattr(target, key, getattr(source, key))


def recommended_env(row: RowResult) -> dict[str, str]:
    """Every technique variable of the row, so the lines replace whatever a .env had for them."""
    return dict(row.env)


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
        return 128 + signal.SIGINT
    except Interrupted as exc:
        return 128 + exc.signum
    return 0


def report(result: BenchResult, work_dir: Path, as_json: bool) -> None:
    fill_relative(result)
    best = fastest_row(result.rows)
    if best is not None:
        result.recommended, result.recommended_env = best.name, recommended_env(best)
    paths = write_reports(result, work_dir)
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print_summary(result, paths)


def run(argv: list[str]) -> int:
    args = parse_args(argv)
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
    ctx = Context(settings.model, Path(settings.model).is_dir(), settings.seq_len, settings.batch_size,
                  info["on_gpu"], args.max_batch)
    plan = RunPlan(args.warmup, args.steps, float(args.row_timeout), work_dir)
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    shutil.rmtree(work_dir / "rows", ignore_errors=True)  # logs of an earlier bench would not match its results
    bench = Bench(specs, ctx, plan, ui=None)
    try:
        code = measure_rows(bench, len(specs))
    finally:
        remove_scratch(work_dir)
    meta = build_meta(settings, info, plan, argv, load_before)
    if code:
        meta["interrupted"] = f"stopped by signal {code - 128} after {len(bench.results)} of {len(specs)} rows"
        print(f"interrupted: {meta['interrupted']}; writing the results so far", file=sys.stderr)
    report(BenchResult(meta, BASELINE, list(bench.results.values())), work_dir, args.json)
    return code


def remove_scratch(work_dir: Path) -> None:
    """The rows' temporary output folders and the shared tokenized-data cache."""
    for name in (".tmp", ".cache"):
        shutil.rmtree(work_dir / name, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """`python -m trainer bench [--rows a,b] [--steps N] [--warmup N] [--json]`; returns the exit code."""
    previous = signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        return run(list(sys.argv[1:] if argv is None else argv))
    except ConfigError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_USER
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except Interrupted as exc:
        print("interrupted", file=sys.stderr)
        return 128 + exc.signum
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
