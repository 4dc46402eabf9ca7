"""`Bench`: runs the selected rows in order; each row builds on the best result so far."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from trainer.bench.catalogue import (
    ADAPTER_ROWS,
    AUTO_ENV,
    BASELINE,
    BASELINE_ENV,
    COMBINABLE_GROUPS,
    COMBINED,
    DEFAULTS,
    GRAD_ACCUM,
    MAX_BATCH,
    PRECOMPUTED_REFERENCE,
    RL_SPLIT,
    UNSET,
    RowSpec,
    catalogue,
)
from trainer.bench.report import (
    BenchProgress,
    RowResult,
)
from trainer.bench.runner import OK, SKIPPED, RowOutcome, RunPlan, row_dir, run_row
from trainer.config.method import OPTION_METHODS
from trainer.errors import ConfigError
from trainer.methods import names, of, spoken


@dataclass(frozen=True)
class Context:
    """What the rows need to know about the user's configuration and this machine."""

    model: str
    model_is_folder: bool
    seq_len: int
    batch_size: int
    on_gpu: bool
    max_batch: int
    auto_compile: bool = False  # what TRAIN_COMPILE=auto decides for a long run here (bench rows are short)
    method: str = "sft"  # TRAIN_METHOD: every row trains with it
    moe: str = ""  # why the moe rows cannot run ('' where TRAIN_MODEL is a mixture of experts this stack runs)
    grouped_mm: str = ""  # why torch's grouped GEMM cannot run on this device ('' where it can)


# ---- running the rows ----------------------------------------------------------------------------

class Bench:
    """Runs the selected rows in order, keeping each result and the reference the next rows build on."""

    def __init__(self, specs: list[RowSpec], ctx: Context, plan: RunPlan, ui: BenchProgress | None,
                 earlier: list[RowResult] | None = None, time_limit_s: float | None = None) -> None:
        self.specs = specs
        self.ctx = ctx
        self.plan = plan
        self.ui = ui
        self.results: dict[str, RowResult] = {row.name: row for row in earlier or []}  # kept, not measured again
        self.reused = set(self.results)
        self.deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
        self.left: list[str] = []  # rows not started because the time limit was reached

    # The reference for the technique rows: the trainer's defaults (`auto`) when they ran, else the fastest
    # precision row that ran, else the baseline.
    def reference(self) -> RowResult | None:
        auto = self.results.get(DEFAULTS)
        if auto is not None and auto.ok:
            return auto
        ran = [r for r in self.results.values() if r.group == "precision" and r.ok]
        if ran:
            return max(ran, key=lambda r: r.tokens_per_s or 0.0)
        return self.results.get(BASELINE)

    def baseline_env(self) -> dict[str, str]:
        return {**BASELINE_ENV, "TRAIN_BATCH_SIZE": str(self.ctx.batch_size)}

    def reference_env(self) -> dict[str, str]:
        ref = self.reference()
        if ref is not None and ref.ok:
            return dict(ref.env)
        return self.baseline_env()

    def run(self) -> list[RowResult]:
        for spec in self.specs:
            if spec.name in self.reused and self.still_valid(self.results[spec.name]):
                continue
            if self.deadline is not None and time.monotonic() >= self.deadline:
                self.left = [s.name for s in self.specs if s.name not in self.results]
                break
            result = self.run_spec(spec)
            self.results[spec.name] = result
            if self.ui:
                self.ui.row_done(result)
            if spec.name == BASELINE and result.status == SKIPPED:
                raise ConfigError(f"the baseline row cannot run with this configuration: {result.reason}")
        return self.ordered()

    def ordered(self) -> list[RowResult]:
        """Every result, this call's and the kept ones, in the catalogue's order."""
        order = {spec.name: index for index, spec in enumerate(catalogue())}
        return sorted(self.results.values(), key=lambda row: order.get(row.name, len(order)))

    def still_valid(self, kept: RowResult) -> bool:
        """A kept row stands, but `combined`, whose winners may have changed, only if it stacks the same rows."""
        if kept.name != COMBINED:
            return True
        plan = self.combined_plan()
        return kept.ok and not isinstance(plan, str) and plan[0] == kept.env

    def run_spec(self, spec: RowSpec) -> RowResult:
        if spec.group == "precision":
            return self.measure(spec, {**self.baseline_env(), **spec.env},
                                on_top_of=None if spec.name == BASELINE else BASELINE)
        if spec.name == DEFAULTS:
            return self.run_defaults(spec)
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
        if spec.name == RL_SPLIT:
            return with_split_note(self.measure(spec, env, on_top_of))
        if spec.name == GRAD_ACCUM:  # the batch search would merge the micro-batches again
            env.update(grad_accum_env(self.ctx.batch_size), TRAIN_AUTO_BATCH="0")
        row = self.measure(spec, env, on_top_of)
        return with_loss_note(row, self.results.values()) if spec.group == "moe" else row

    def skip_reason(self, spec: RowSpec) -> str:
        """Why a row cannot apply here, known without starting the trainer ('' when it may run)."""
        if spec.name in ADAPTER_ROWS and not self.ctx.model_is_folder:
            return (f"needs a pretrained model: TRAIN_MODEL={self.ctx.model} is a preset; "
                    "set it to a Hugging Face model folder to measure LoRA/QLoRA")
        if spec.name == GRAD_ACCUM and self.ctx.batch_size < 2:
            return "needs TRAIN_BATCH_SIZE of 2 or more to split into accumulation steps"
        method = of(self.ctx.method)
        if spec.name == PRECOMPUTED_REFERENCE and not method.reference:
            return (f"applies to preference tuning with a reference model, not TRAIN_METHOD={self.ctx.method}; set "
                    f"TRAIN_METHOD={spoken(OPTION_METHODS['pref_reference'])} (and pairs in TRAIN_DATA) to measure it")
        if spec.name == RL_SPLIT and method.family != "online":
            return (f"applies to online RL, not TRAIN_METHOD={self.ctx.method}; set TRAIN_METHOD="
                    f"{spoken(names('online'))} (and prompts in TRAIN_DATA, rewards in TRAIN_REWARD) to measure it")
        if spec.name == MAX_BATCH and not self.ctx.on_gpu:
            return "not supported here: the probe doubles the batch until GPU memory runs out (no GPU found)"
        if spec.group == "moe" and (self.ctx.moe or (spec.name == "moe_grouped_mm" and self.ctx.grouped_mm)):
            return f"not measured here: {self.ctx.moe or self.ctx.grouped_mm}"
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
            row.generation_s, row.loss = m.generation_s, m.loss
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

    def defaults_env(self) -> dict[str, str]:
        """The trainer's defaults; TRAIN_COMPILE as auto decides for a long run (a row's few steps turn it off). On a
        GPU TRAIN_BATCH_SIZE and TRAIN_GRAD_ACCUM are left unset, so the batch search chooses the batch (set, it
        would keep their product)."""
        env = {**self.baseline_env(), **AUTO_ENV, "TRAIN_COMPILE": "1" if self.ctx.auto_compile else "auto"}
        if self.ctx.on_gpu:
            env.update(TRAIN_BATCH_SIZE=UNSET, TRAIN_GRAD_ACCUM=UNSET)
        return env

    def run_defaults(self, spec: RowSpec) -> RowResult:
        """The baseline with the technique variables left at auto; the note says what the trainer chose."""
        row = self.measure(spec, self.defaults_env(), on_top_of=BASELINE)
        chosen = chosen_values(row_dir(self.plan, spec.name), spec.env)
        if chosen:
            row.note = "auto chose " + ", ".join(f"{k}={v}" for k, v in chosen.items()) + (
                f"; {row.note}" if row.note else "")
        return row

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
            return "neither the defaults nor a precision row ran, nothing to build on"
        winners = [w for w in (self.group_winner(group, ref) for group in COMBINABLE_GROUPS) if w is not None]
        if not winners:
            return f"no optimizer, attention, compile, kernels or batch row beat `{ref.name}`"
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

    def group_winner(self, group: str, ref: RowResult) -> RowResult | None:
        faster = [r for r in self.results.values()
                  if r.group == group and r.ok and r.env != ref.env and (r.tokens_per_s or 0) > (ref.tokens_per_s or 0)]
        return max(faster, key=lambda r: r.tokens_per_s or 0.0, default=None)


def with_split_note(row: RowResult) -> RowResult:
    """rl_split's note: a step's seconds producing the completions and training on them (the step time less it)."""
    if row.ok and row.generation_s is not None and row.step_time_s:
        training = max(0.0, row.step_time_s - row.generation_s)
        split = (f"per step: {row.generation_s:.3g} s generating and scoring the completions "
                 f"({row.generation_s / row.step_time_s:.0%}), {training:.3g} s training")  # fmt: skip
        row.note = f"{split}; {row.note}" if row.note else split
    elif row.ok:
        row.note = "the trainer logged no generation time (not an online RL run?)"
    return row


def grad_accum_env(batch_size: int) -> dict[str, str]:
    """The same effective batch in smaller micro-batches: the smallest accumulation factor >= 2 dividing it."""
    accum = next(k for k in range(2, batch_size + 1) if batch_size % k == 0)
    return {"TRAIN_BATCH_SIZE": str(batch_size // accum), "TRAIN_GRAD_ACCUM": str(accum)}


def chosen_values(row: Path, env: Mapping[str, str]) -> dict[str, str]:
    """What the trainer decided for each TRAIN_* in `env`, read from the run record kept in a row's folder ({} when
    the row's run wrote none)."""
    from trainer.config import run_record

    run = run_record.read(row)
    decisions = run.decision_values() if run else {}
    names = (key.removeprefix("TRAIN_").lower() for key in env)
    return {name: str(decisions[name]) for name in names if name in decisions}


def changes(env: dict[str, str]) -> dict[str, str]:
    """What a row's environment changes from the baseline's (TRAIN_BATCH_SIZE is always listed)."""
    return {k: v for k, v in env.items() if BASELINE_ENV.get(k) != v}


def with_loss_note(row: RowResult, earlier: Iterable[RowResult]) -> RowResult:
    """A moe row's loss against the first moe row that ran: the implementations compute the same training."""
    first = next((r for r in earlier if r.group == "moe" and r.ok and r.loss is not None), None)
    if row.ok and row.loss is not None:
        against = f"; {first.name}'s {first.loss:.6g}, |difference| {abs(row.loss - first.loss):.2g}" if first else ""
        note = f"mean loss of the measured steps {row.loss:.6g}{against}"
        row.note = f"{note}; {row.note}" if row.note else note
    return row


def copy_measurement(source: RowResult, target: RowResult) -> None:
    for key in ("tokens_per_s", "samples_per_s", "step_time_s", "mfu", "peak_mem_bytes", "measured_steps",
                "generation_s", "loss"):  # fmt: skip
        setattr(target, key, getattr(source, key))


def recommendable(rows: list[RowResult]) -> list[RowResult]:
    """The rows a recommendation may come from: the defaults (`auto`) and the rows measured on top of them, so the
    recommendation is auto plus what measured faster, never a value an auto choice was turned back to. Only when
    the defaults did not run, every row."""
    auto = next((r for r in rows if r.name == DEFAULTS and r.ok), None)
    if auto is None:
        return rows
    return [r for r in rows if r is auto or r.on_top_of == DEFAULTS]


def recommended_env(row: RowResult) -> dict[str, str]:
    """Every technique variable of the row, so the lines replace whatever a .env had for them."""
    return dict(row.env)
