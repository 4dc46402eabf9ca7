"""A checkpoint's record, in one home: what a checkpoint holds and what it recorded.

Every published checkpoint (and final/) gets its record last, just before the folder is renamed into place
(trainer.run.checkpoint): a `trainkit_complete` file with the step, the run's TRAIN_* settings (secrets masked), the
Hub commits it loaded, the tracker runs it reported to, the sha256 of the run's provenance.json, the batch (processes,
per-device batch, accumulation and the sequences trained so far), whether it is final/, the time, and every file of
the folder with its size and, for files up to CHECKSUM_MAX_BYTES, a sha256 (the states and configs; hashing the
weights would cost a read of the whole model on every save). Transformers' own record, `trainer_state.json`, says the
step and the batch the Trainer saved with.

Here, once each: the writer (`write_record`), the reader (`read_record`: a missing or damaged record reads as None, a
field of the wrong type as empty), the check of the files against the record (`damage`), and the choice of the newest
checkpoint whose files are whole (`newest_sound_checkpoint`). What a run does with a checkpoint is its callers' to
decide: trainer.config.resume (what to resume, whether the run may continue), trainer.export (what SRC holds).
No other module names these files. Torch-free and imports nothing of trainkit (floor 1).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trainer.provenance import file_sha256

COMPLETE_MARKER = "trainkit_complete"  # the record: written last into every published checkpoint and final/
STATE_FILE = "trainer_state.json"  # Transformers' record of the step, the batch, the best checkpoint
CHECKSUM_MAX_BYTES = 1 << 20
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")

Entries = dict[str, dict[str, Any]]  # {"model": {"repo_id", "sha", ...}} or {"wandb": {"run_id", ...}}


@dataclass(frozen=True)
class BatchRecord:
    """How the run went through its data: `processes` x `per_device` x `accumulation` sequences per optimizer step,
    and the sequences trained up to `step` (each optimizer step takes the next `effective` of the shuffled order)."""

    processes: int
    per_device: int
    accumulation: int
    samples_seen: int
    step: int

    @property
    def effective(self) -> int:
        return self.processes * self.per_device * self.accumulation

    def at(self, step: int) -> BatchRecord:
        """This batch's record at a later `step`: the sequences of the steps since counted in."""
        return replace(self, samples_seen=self.samples_seen + (step - self.step) * self.effective, step=step)

    def as_json(self) -> dict[str, int]:
        return {"processes": self.processes, "per_device": self.per_device, "accumulation": self.accumulation,
                "samples_seen": self.samples_seen}  # fmt: skip


def _batch_record(value: Any, step: int | None) -> BatchRecord | None:
    keys = ("processes", "per_device", "accumulation", "samples_seen")
    if not isinstance(value, dict) or step is None:
        return None
    if not all(isinstance(value.get(k), int) and not isinstance(value.get(k), bool) for k in keys):
        return None
    counts = {k: int(value[k]) for k in keys}
    return BatchRecord(counts["processes"], counts["per_device"], counts["accumulation"], counts["samples_seen"], step)


@dataclass
class CheckpointRecord:
    """What a checkpoint recorded. A run fills settings and hub once and trackers as its tracker runs start; the
    writer adds the step, the files and the time to each checkpoint's copy."""

    settings: dict[str, Any] | None = None  # TRAIN_* by field name, secrets masked (None: an older trainkit)
    hub: Entries = field(default_factory=dict)  # the Hub commits the run loaded, by setting (model, data, ...)
    trackers: Entries = field(default_factory=dict)  # the tracker runs it reported to, for a resume to continue
    step: int | None = None
    final: bool = False  # final/, not a checkpoint-N
    files: dict[str, dict[str, Any]] | None = None  # relative path -> {"size", "sha256"} (None: listed none)
    time: float | None = None
    provenance: dict[str, Any] | None = None  # the run's provenance.json: {"file", "sha256"} (trainer.provenance)
    batch: BatchRecord | None = None  # processes, batch, accumulation and sequences trained (None: an older trainkit)


# ---- write and read ------------------------------------------------------------------------------------------------


def write_record(folder: Path, run: CheckpointRecord, step: int, final: bool = False) -> None:
    """Record `folder` as complete: the run's record with this step, every file of the folder and the time."""
    data: dict[str, Any] = {"step": step}
    if run.settings is not None:
        data["settings"] = run.settings
    if run.hub:
        data["hub"] = run.hub
    if run.trackers:
        data["trackers"] = run.trackers
    if final:
        data["final"] = True
    if run.provenance:
        data["provenance"] = run.provenance
    if run.batch is not None:
        data["batch"] = run.batch.at(step).as_json()
    data.update(files=manifest(folder), time=time.time())
    (folder / COMPLETE_MARKER).write_text(json.dumps(data) + "\n")


def read_record(folder: Path) -> CheckpointRecord | None:
    """The record of `folder`; None when it has none or it cannot be read."""
    try:
        data = json.loads((Path(folder) / COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    step, stamp = data.get("step"), data.get("time")
    step = step if isinstance(step, int) and not isinstance(step, bool) else None
    return CheckpointRecord(
        settings=_dict_or_none(data.get("settings")),
        hub=_entries(data.get("hub")),
        trackers=_entries(data.get("trackers")),
        step=step,
        final=data.get("final") is True,
        files=_dict_or_none(data.get("files")),
        time=float(stamp) if isinstance(stamp, (int, float)) else None,
        provenance=_dict_or_none(data.get("provenance")),
        batch=_batch_record(data.get("batch"), step),
    )


def _dict_or_none(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _entries(value: Any) -> Entries:
    return {k: v for k, v in value.items() if isinstance(v, dict)} if isinstance(value, dict) else {}


def has_record(folder: Path) -> bool:
    return (Path(folder) / COMPLETE_MARKER).is_file()


def missing_record(folder: Path) -> str | None:
    """Why `folder` has no record, with the fix, for a message (None: it has one)."""
    if has_record(folder):
        return None
    return (f"no {COMPLETE_MARKER} marker, so it may be a partial save; if you know it is complete, create the file "
            f"{Path(folder) / COMPLETE_MARKER}")  # fmt: skip


# ---- what Transformers recorded ------------------------------------------------------------------------------------


def state_path(folder: Path) -> Path:
    """Where Transformers' state of the checkpoint `folder` is."""
    return Path(folder) / STATE_FILE


def has_trainer_state(folder: Path) -> bool:
    return state_path(folder).is_file()


def _state(folder: Path) -> dict[str, Any]:
    """trainer_state.json of a checkpoint; OSError or ValueError when it cannot be read."""
    return json.loads(state_path(folder).read_text())


def recorded_step(folder: Path) -> int:
    """The global step a checkpoint was saved at; OSError, ValueError, KeyError or TypeError when it does not say."""
    return int(_state(folder)["global_step"])


def unreadable_state(folder: Path) -> str | None:
    """What keeps the step of `folder` from being read, for a message (None: it can be read)."""
    try:
        recorded_step(folder)
    except (OSError, ValueError, KeyError, TypeError):
        return f"no readable {STATE_FILE}"
    return None


def recorded_batch_size(folder: Path) -> int | None:
    """The per-device batch the checkpoint trained with (None when it does not say, or is gone: rotated away)."""
    try:
        value = _state(folder).get("train_batch_size")
    except (OSError, ValueError, AttributeError):
        return None
    return int(value) if isinstance(value, int) and value > 0 else None


# ---- which folders are checkpoints ---------------------------------------------------------------------------------


def checkpoint_step(folder: Path) -> int | None:
    """N of a `checkpoint-N` folder name; None for any other name."""
    m = _CHECKPOINT_RE.match(folder.name)
    return int(m.group(1)) if m else None


def checkpoint_folders(output_dir: str | Path) -> list[Path]:
    """Every `checkpoint-N` folder of `output_dir` (complete or not), oldest step first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and checkpoint_step(p) is not None]
    return sorted(found, key=lambda p: checkpoint_step(p) or 0)


def is_complete(folder: Path) -> bool:
    return has_record(folder) and has_trainer_state(folder)


def complete_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoint folders (a record and Transformers' state), oldest step first."""
    return [p for p in checkpoint_folders(output_dir) if is_complete(p)]


def newest_sound_checkpoint(output_dir: str | Path, on_damaged: Callable[[Path, str], None] | None = None
                            ) -> Path | None:  # fmt: skip
    """The newest complete checkpoint whose files are what its record lists; `on_damaged(folder, problem)` hears of
    each newer one passed over."""
    for folder in reversed(complete_checkpoints(output_dir)):
        problem = damage(folder)
        if problem is None:
            return folder
        if not folder.is_dir():  # rotated away by the run that owns the folder while this looked: not damage
            continue
        if on_damaged is not None:
            on_damaged(folder, problem)
    return None


# ---- whole ---------------------------------------------------------------------------------------------------------


def manifest(folder: Path) -> dict[str, dict[str, Any]]:
    """{relative path: {"size", "sha256" (small files)}} of every file in a checkpoint folder, the record aside."""
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name != COMPLETE_MARKER:
            size = path.stat().st_size
            entry: dict[str, Any] = {"size": size}
            if size <= CHECKSUM_MAX_BYTES:
                entry["sha256"] = file_sha256(path)
            files[str(path.relative_to(folder))] = entry
    return files


def damage(folder: Path) -> str | None:
    """What is wrong with a recorded checkpoint's files (None: nothing found; a record of an older trainkit lists no
    files and is taken as it is)."""
    record = read_record(folder)
    if record is None:
        return f"its {COMPLETE_MARKER} marker is unreadable"
    for name, listed in (record.files or {}).items():
        entry = listed if isinstance(listed, dict) else {}
        path = folder / name
        try:
            size = path.stat().st_size
        except OSError:
            return f"{path} is missing"
        if size != entry.get("size"):
            return f"{path} has {size} bytes, the checkpoint was saved with {entry.get('size')}"
        try:
            changed = "sha256" in entry and file_sha256(path) != entry["sha256"]
        except OSError:
            return f"{path} is missing"
        if changed:
            return f"{path} differs from what was saved (sha256)"
    return None


# ---- what a folder holds -------------------------------------------------------------------------------------------


def holds_full_model(folder: Path) -> bool:
    """A whole model: config.json and weights (safetensors, or PyTorch .bin files other than Transformers'
    training_args.bin, which every checkpoint holds)."""
    folder = Path(folder)
    weights = [*folder.glob("*.safetensors"), *(p for p in folder.glob("*.bin") if p.name != "training_args.bin")]
    return (folder / "config.json").is_file() and bool(weights)
