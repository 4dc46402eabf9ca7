"""Resume, decided in one place: what a run continues from, and whether it may continue.

What a checkpoint holds and recorded (its step and batch, the Hub commits and tracker runs of the run that wrote it,
its settings, its files) is trainer.checkpoint_record's to read; this module decides with it:

- What to resume (`decide`, `chosen_checkpoint`): TRAIN_RESUME=never starts from scratch, auto takes the newest
  complete checkpoint of TRAIN_OUTPUT_DIR whose files are whole (none: from scratch; each damaged one passed over is
  named in a warning), a path names the checkpoint folder. The Hub commits its record holds pin the resumed run
  (`hub_pins`, asked by trainer.hub.sources).
- Whether the run may continue from a TRAIN_RESUME path (`resumable_problems`, `check_whole`): Transformers' state
  and the record must be there, and the files the record lists whole; else a ConfigError naming what is wrong.
- Whether it is the same run (`check_drift`): each TRAIN_* field says in trainer.config.schema what a change of it
  means on resume (its `on_resume` rule). A change the checkpoint cannot continue with (FIXED: model, tokenizer,
  LoRA, quantization, sharding) is a ConfigError naming each variable; a change of the training data or its order
  (DATA) too, unless TRAIN_RESUME_CHANGED_DATA=1; any other change (FREE) goes on, with one log line naming it. The
  settings that steer the resume itself (NOT_RECORDED) are neither recorded nor compared.
- How it goes on (`continuation`): by the sequences already trained. Each checkpoint records its batch (processes x
  per-device batch x accumulation) and the sequences trained; on another process count the run keeps the effective
  batch by changing the accumulation (where it divides; else a ConfigError saying why), so each step takes the same
  sequences of the shuffled order as before, none twice and none left out. Sharded state is read across the change
  where it can be: full state dicts (DDP, FSDP as trainkit configures it) as they are, DeepSpeed ZeRO through its
  universal checkpoint (trainer.run.reshard); ZeRO's NVMe-offloaded state is per rank and refused.
- A used folder and TRAIN_RESUME=never: the earlier run's checkpoints would mix with the new ones (rotation, auto
  resume): a ConfigError unless TRAIN_START_OVER=1, and then the run moves them to `previous-runs/<time>/`
  (`set_aside_earlier_run`).

Torch-free: stage 1 of the configuration (trainer.config.checks) and the Hub resolution ask it before anything heavy
is loaded. The run (train.py) and the checks ask it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer import checkpoint_record as records
from trainer.checkpoint_record import BatchRecord
from trainer.config import rl_tools
from trainer.config.online import reward_identity
from trainer.config.schema import OnResume, TrainSettings, resume_rule
from trainer.data.mix import identity
from trainer.errors import ConfigError
from trainer.secrets import mask_secrets

PREVIOUS_RUNS = "previous-runs"

log = logging.getLogger("trainer")


@dataclass(frozen=True)
class Resume:
    """The checkpoint this run continues from (None: from scratch) and why, as the log says it."""

    checkpoint: Path | None
    reason: str

    @property
    def step(self) -> int:
        """The optimizer step the checkpoint recorded (0 when starting from scratch)."""
        return records.recorded_step(self.checkpoint) if self.checkpoint else 0


# ---- what to resume ------------------------------------------------------------------------------------------------


def chosen_checkpoint(settings: TrainSettings) -> Path | None:
    """The folder TRAIN_RESUME points this run at, not yet checked (`decide` checks it): None for never, or for auto
    when TRAIN_OUTPUT_DIR holds no sound checkpoint."""
    if settings.resume == "never":
        return None
    if settings.resume == "auto":
        return records.newest_sound_checkpoint(settings.output_dir)
    return Path(settings.resume)


def _warn_damaged(folder: Path, problem: str) -> None:
    log.warning("resume: %s is damaged (%s); falling back to the previous complete checkpoint", folder, problem)


def decide(settings: TrainSettings) -> Resume:
    """What this run continues from; a TRAIN_RESUME path the run may not continue from is a ConfigError (exit 2)."""
    out = Path(settings.output_dir)
    if settings.resume == "never":
        refuse_used_folder(out, settings.start_over)
        return Resume(None, "TRAIN_RESUME=never, starting from scratch")
    if settings.resume == "auto":
        folder = records.newest_sound_checkpoint(out, on_damaged=_warn_damaged)
        if folder is None:
            return Resume(None, f"no complete checkpoint in {out}, starting from scratch")
        reason = f"continuing from {folder} (newest complete checkpoint)"
    else:
        folder = Path(settings.resume)
        problems = resumable_problems(folder)
        if problems:
            raise ConfigError(*problems)
        check_whole(folder)
        reason = f"continuing from {folder} (TRAIN_RESUME)"
    check_drift(folder, settings)
    return Resume(folder, reason)


# ---- whether the run may continue ----------------------------------------------------------------------------------


def resumable_problems(folder: Path) -> list[str]:
    """Why the run may not continue from `folder` (empty: it may)."""
    unreadable = records.unreadable_state(folder)
    if unreadable:
        return [
            f"TRAIN_RESUME={folder}: not a checkpoint folder ({unreadable}); use auto, never or a checkpoint-N folder"
        ]
    missing = records.missing_record(folder)
    return [f"TRAIN_RESUME={folder}: {missing}"] if missing else []


def check_whole(folder: Path) -> None:
    """TRAIN_RESUME=PATH: a damaged checkpoint is a ConfigError naming the file."""
    problem = records.damage(folder)
    if problem:
        raise ConfigError(
            f"TRAIN_RESUME={folder}: the checkpoint is damaged: {problem}. Point TRAIN_RESUME at another checkpoint "
            "(TRAIN_RESUME=auto takes the newest whole one)"
        )


# ---- what the resumed run takes from its checkpoint ----------------------------------------------------------------


def hub_pins(settings: TrainSettings) -> dict[str, dict[str, str]]:
    """{"model": {repo_id, sha, checkpoint}, ...} from the checkpoint this run will resume from, if any."""
    folder = chosen_checkpoint(settings)
    record = records.read_record(folder) if folder is not None else None
    if record is None:
        return {}
    return {key: {**entry, "checkpoint": str(folder)} for key, entry in record.hub.items()}


def recorded_tracker_runs(folder: Path) -> dict[str, dict[str, str]]:
    """{"wandb": {"run_id", ...}, "mlflow": {...}}: the tracker runs the checkpoint recorded ({} when unreadable); a
    resumed run continues them (trainer.trackers.environment)."""
    record = records.read_record(folder)
    return record.trackers if record else {}


# ---- the same run --------------------------------------------------------------------------------------------------


def _env(name: str) -> str:
    return f"TRAIN_{name.upper()}"


def recorded_settings(settings: TrainSettings) -> dict[str, Any]:
    """The TRAIN_* settings a checkpoint records (secrets masked), by field name."""
    values = json.loads(json.dumps(settings.model_dump(), default=str))
    values["data"] = identity(values["data"])  # a mix file's weights are part of the data
    values["reward"] = reward_identity(values["reward"])  # so is a reward file's content (online RL)
    for name in ("rl_tools", "rl_environment"):  # and a tool's or an environment's (multi-turn online RL)
        values[name] = rl_tools.identity(values[name])
    return {k: v for k, v in mask_secrets(values).items() if resume_rule(k) is not OnResume.NOT_RECORDED}


def run_record(settings: TrainSettings, hub: dict[str, Any], batch: BatchRecord | None = None
               ) -> records.CheckpointRecord:  # fmt: skip
    """What every checkpoint of this run records for a later resume: its settings, the Hub commits it loaded
    (RunConfig's `hub`) and its batch; the trackers add their runs, the writer the step and the files."""
    return records.CheckpointRecord(settings=recorded_settings(settings), hub=dict(hub), batch=batch)


def check_drift(checkpoint: Path, settings: TrainSettings, quiet: bool = False) -> None:
    """ConfigError when this run's settings differ from the checkpoint's in a way it cannot continue with; the
    changes it may continue with are logged (unless `quiet`)."""
    record = records.read_record(checkpoint)
    before = record.settings if record else None
    if before is None:
        if not quiet:
            log.info("resume: %s recorded no settings (an older trainkit): changes are not checked", checkpoint)
        return
    now = recorded_settings(settings)
    changed = {k: (before[k], now[k]) for k in sorted(before.keys() & now.keys()) if before[k] != now[k]}
    named = {k: f"{_env(k)} was {old!r}, now {new!r}" for k, (old, new) in changed.items()}
    fresh = "or start a new run: another TRAIN_OUTPUT_DIR, or TRAIN_RESUME=never with TRAIN_START_OVER=1 here"
    blocking = [named[k] for k in changed if resume_rule(k) is OnResume.FIXED]
    if blocking:
        raise ConfigError(*blocking, f"{checkpoint} cannot continue with these changes: restore them, {fresh}")
    data = [named[k] for k in changed if resume_rule(k) is OnResume.DATA]
    if data and not getattr(settings, "resume_changed_data", False):
        raise ConfigError(
            *data,
            f"these change the training data or its order from what {checkpoint} trained on: restore them, {fresh}, "
            "or set TRAIN_RESUME_CHANGED_DATA=1 to continue on the changed data",
        )
    if changed and not quiet:
        log.info("resume: continuing with changed settings: %s", "; ".join(named.values()))


# ---- how it goes on -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Continuation:
    """How this run goes on: its accumulation, its batch record from the resumed step, the process count whose
    sharded state it reads when that differs from its own (None: the same), and what the log says."""

    accumulation: int
    batch: BatchRecord
    reshard_from: int | None
    note: str


def continuation(checkpoint: Path | None, settings: TrainSettings, processes: int, accumulation: int) -> Continuation:
    """How a run of `processes` processes (`accumulation` as decided) continues from `checkpoint`; a ConfigError
    when it cannot continue by the sequences already trained."""
    per_device = settings.batch_size
    record = records.read_record(checkpoint) if checkpoint is not None else None
    step = records.recorded_step(checkpoint) if checkpoint is not None else 0
    before = record.batch if record else None
    if before is None:
        if checkpoint is not None:
            _refuse_unknown_world(checkpoint, record, settings)
        batch = BatchRecord(processes, per_device, accumulation, step * processes * per_device * accumulation, step)
        return Continuation(accumulation, batch, None, "")
    same_batch = record is not None and record.settings is not None and all(
        record.settings.get(k) == getattr(settings, k) for k in ("batch_size", "grad_accum"))  # fmt: skip
    kept = _accumulation_keeping(before, per_device, processes) if same_batch else accumulation
    if kept is None:
        kept = _refuse_uneven(checkpoint, before, per_device, processes, settings)
    batch = BatchRecord(processes, per_device, kept, before.samples_seen, step)
    if before.processes != processes:
        _refuse_unreadable_shards(checkpoint, before.processes, processes, settings)
    return Continuation(kept, batch, before.processes if before.processes != processes else None,
                        _note(before, batch))  # fmt: skip


def _accumulation_keeping(before: BatchRecord, per_device: int, processes: int) -> int | None:
    """The accumulation that keeps `before`'s effective batch on `processes` x `per_device` (None: none does)."""
    share = per_device * processes
    return before.effective // share if before.effective % share == 0 else None


def _note(before: BatchRecord, now: BatchRecord) -> str:
    seen = f"{before.samples_seen} sequences already trained (step {before.step}); continuing with the next"
    if before.processes == now.processes and before.accumulation == now.accumulation:
        return seen
    kept = "keeps" if now.effective == before.effective else "changes"
    return (f"{before.processes} -> {now.processes} process(es): accumulation {before.accumulation} -> "
            f"{now.accumulation} {kept} the effective batch ({before.effective} -> {now.effective} sequences per step: "
            f"{now.per_device} per device x {now.accumulation} x {now.processes}); {seen}")  # fmt: skip


def _refuse_uneven(checkpoint: Path | None, before: BatchRecord, per_device: int, processes: int,
                   settings: TrainSettings) -> int:  # fmt: skip
    """No whole accumulation keeps the effective batch: a ConfigError, or TRAIN_GRAD_ACCUM under
    TRAIN_RESUME_CHANGED_DATA=1 (the order then goes on by steps, not sequences: logged)."""
    reason = (f"{checkpoint} trained {before.effective} sequences per step ({before.per_device} per device x "
              f"{before.accumulation} accumulation x {before.processes} process(es)); on {processes} process(es) of "
              f"TRAIN_BATCH_SIZE={per_device} no whole accumulation keeps that ({before.effective} is not a multiple "
              f"of {per_device * processes})")  # fmt: skip
    if settings.resume_changed_data:
        log.warning("resume: %s; TRAIN_RESUME_CHANGED_DATA=1: continuing with TRAIN_GRAD_ACCUM=%d, the data order "
                    "by steps, not by the sequences already trained", reason, settings.grad_accum)  # fmt: skip
        return settings.grad_accum
    raise ConfigError(
        reason,
        "resume on a process count that divides it, or set TRAIN_BATCH_SIZE/TRAIN_GRAD_ACCUM with "
        "TRAIN_RESUME_CHANGED_DATA=1 to continue with another batch",
    )


def _refuse_unknown_world(checkpoint: Path, record: records.CheckpointRecord | None, settings: TrainSettings) -> None:
    """A checkpoint of an older trainkit recorded no batch: a changed TRAIN_NPROC_PER_NODE is a changed data order."""
    was = record.settings.get("nproc_per_node") if record and record.settings else None
    if was is None or was == settings.nproc_per_node or settings.resume_changed_data:
        return
    raise ConfigError(
        f"TRAIN_NPROC_PER_NODE was {was!r}, now {settings.nproc_per_node!r}, and {checkpoint} recorded no batch (an "
        "older trainkit), so the sequences it trained are not known: restore TRAIN_NPROC_PER_NODE, or set "
        "TRAIN_RESUME_CHANGED_DATA=1 to continue by steps"
    )


def _refuse_unreadable_shards(checkpoint: Path | None, was: int, now: int, settings: TrainSettings) -> None:
    """Sharded state that cannot be read on another process count: a ConfigError saying why."""
    if settings.zero_offload == "nvme":
        raise ConfigError(
            f"{checkpoint} was saved by {was} process(es) with TRAIN_ZERO_OFFLOAD=nvme: DeepSpeed keeps each rank's "
            f"offloaded optimizer state in its own files and cannot convert them for {now} process(es); resume on "
            f"{was} process(es), or start a new run from its weights (TRAIN_MODEL={checkpoint})"
        )


# ---- a used folder -------------------------------------------------------------------------------------------------


def earlier_outputs(output_dir: Path) -> list[Path]:
    """An earlier run's checkpoints (complete or not) and final/ in `output_dir`."""
    found = records.checkpoint_folders(output_dir)
    final = output_dir / "final"
    return [*found, final] if final.is_dir() else found


def refuse_used_folder(output_dir: Path, start_over: bool) -> None:
    """TRAIN_RESUME=never in a folder with an earlier run's checkpoints: ConfigError unless TRAIN_START_OVER=1."""
    earlier = earlier_outputs(output_dir)
    if earlier and not start_over:
        raise ConfigError(
            f"TRAIN_RESUME=never, but TRAIN_OUTPUT_DIR={output_dir} holds an earlier run "
            f"({', '.join(p.name for p in earlier)}): its checkpoints would mix with this run's. TRAIN_RESUME=auto "
            f"continues it; TRAIN_START_OVER=1 moves it aside to {output_dir / PREVIOUS_RUNS}/ and starts over here; "
            "or use another TRAIN_OUTPUT_DIR"
        )


def set_aside_earlier_run(output_dir: Path) -> None:
    """TRAIN_START_OVER=1: move the earlier run's checkpoints, final/, metrics.jsonl, samples.jsonl and evals.jsonl
    to previous-runs/<time>/ (nothing is deleted). Called by the process that writes, once the output folder is
    locked."""
    earlier = earlier_outputs(output_dir)
    if not earlier:
        return
    aside = output_dir / PREVIOUS_RUNS / time.strftime("%Y%m%d-%H%M%S")
    aside.mkdir(parents=True, exist_ok=True)
    for path in [*earlier, *(output_dir / name for name in ("metrics.jsonl", "samples.jsonl", "evals.jsonl"))]:
        if path.exists():
            os.rename(path, aside / path.name)
    log.warning("TRAIN_START_OVER: the earlier run (%s, metrics.jsonl) moved to %s; starting over",
                ", ".join(p.name for p in earlier), aside)  # fmt: skip
