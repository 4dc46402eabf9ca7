"""Resume, decided in one place: what a run continues from, what a checkpoint recorded, whether it may continue.

- What to resume (`decide`, `chosen_checkpoint`): TRAIN_RESUME=never starts from scratch, auto takes the newest
  complete checkpoint of TRAIN_OUTPUT_DIR (none: from scratch), a path names the checkpoint folder.
- What a checkpoint recorded: its step and batch (`trainer_state.json`, read here only) and the Hub commits of the
  run that wrote it (the `trainkit_complete` marker's `hub` entry, which pins a resumed run: trainer.hub.sources).
- Whether the run may continue from a folder (`resumable_problems`): a readable trainer_state.json and the marker,
  and the files the marker lists (`damage`): every file of the checkpoint with its size, and a sha256 for files up
  to CHECKSUM_MAX_BYTES (the states and configs; hashing the weights would cost a read of the whole model on every
  save). Auto resume falls back past a damaged checkpoint with a warning naming the file; a damaged TRAIN_RESUME
  path is a ConfigError. Markers of older trainkit versions list no files: they are taken as they are.
- Whether it is the same run (`check_drift`): the marker records the TRAIN_* settings (secrets masked). A change the
  checkpoint cannot continue with (CANNOT_CHANGE: model, tokenizer, LoRA, quantization, sharding) is a ConfigError
  naming each variable; a change of the training data or its order (DATA_CHANGES) too, unless
  TRAIN_RESUME_CHANGED_DATA=1; any other change goes on, with one log line naming it.
- A used folder and TRAIN_RESUME=never: the earlier run's checkpoints would mix with the new ones (rotation, auto
  resume): a ConfigError unless TRAIN_START_OVER=1, and then the run moves them to `previous-runs/<time>/`
  (`set_aside_earlier_run`). Each start's run_config.json is kept in run_configs/ (`archive_run_config`).

Torch-free and imports nothing of trainkit above trainer.errors and trainer.secrets: stage 1 of the configuration
(trainer.config.checks) and the Hub resolution ask it before anything heavy is loaded. The run (train.py,
batch_search.py), the checkpoint writer (checkpoint.py) and the checks all ask it; none of them reads these files
itself.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.errors import ConfigError
from trainer.secrets import mask_secrets

if TYPE_CHECKING:
    from trainer.config.schema import TrainSettings

COMPLETE_MARKER = "trainkit_complete"  # written last into every published checkpoint (trainer.run.checkpoint)
STATE_FILE = "trainer_state.json"  # Transformers' record of the step, the batch, the best checkpoint
MODES = ("auto", "never")  # TRAIN_RESUME's words; anything else is a checkpoint folder
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
CHECKSUM_MAX_BYTES = 1 << 20
CANNOT_CHANGE = ("model", "tokenizer", "lora", "lora_r", "lora_alpha", "lora_targets", "quant", "zero_stage", "fsdp",
                 "method", "pref_beta", "pref_loss", "pref_reference")  # = trainer.config.methods.RESUME_FIXED
# What the run trains on, and in which order (the sampler's seed, the global batch).
DATA_CHANGES = ("data", "text_field", "seq_len", "data_max_bad_lines", "packing", "long_records", "seed",
                "batch_size", "grad_accum", "nproc_per_node")  # fmt: skip
NOT_COMPARED = ("resume", "output_dir", "resume_changed_data", "start_over")
PREVIOUS_RUNS = "previous-runs"
RUN_CONFIG = "run_config.json"
RUN_CONFIGS = "run_configs"

log = logging.getLogger("trainer")


@dataclass(frozen=True)
class Resume:
    """The checkpoint this run continues from (None: from scratch) and why, as the log says it."""

    checkpoint: Path | None
    reason: str

    @property
    def step(self) -> int:
        """The optimizer step the checkpoint recorded (0 when starting from scratch)."""
        return recorded_step(self.checkpoint) if self.checkpoint else 0


# ---- what to resume ------------------------------------------------------------------------------------------------


def checkpoint_step(folder: Path) -> int | None:
    """N of a `checkpoint-N` folder name; None for any other name."""
    m = _CHECKPOINT_RE.match(folder.name)
    return int(m.group(1)) if m else None


def is_complete(folder: Path) -> bool:
    return (folder / COMPLETE_MARKER).is_file() and (folder / STATE_FILE).is_file()


def complete_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoint folders, oldest step first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(checkpoint_step(p), p) for p in root.iterdir() if p.is_dir() and checkpoint_step(p) is not None]
    return [p for step, p in sorted(found, key=lambda x: x[0] or 0) if is_complete(p)]


def newest_complete_checkpoint(output_dir: str | Path) -> Path | None:
    done = complete_checkpoints(output_dir)
    return done[-1] if done else None


def chosen_checkpoint(settings: TrainSettings) -> Path | None:
    """The folder TRAIN_RESUME points this run at, not yet checked (`decide` checks it): None for never, or for auto
    when TRAIN_OUTPUT_DIR holds no complete checkpoint."""
    if settings.resume == "never":
        return None
    if settings.resume == "auto":
        return next((f for f in reversed(complete_checkpoints(settings.output_dir)) if damage(f) is None), None)
    return Path(settings.resume)


def decide(settings: TrainSettings) -> Resume:
    """What this run continues from; a TRAIN_RESUME path the run may not continue from is a ConfigError (exit 2)."""
    out = Path(settings.output_dir)
    if settings.resume == "never":
        refuse_used_folder(out, settings.start_over)
        return Resume(None, "TRAIN_RESUME=never, starting from scratch")
    if settings.resume == "auto":
        folder = sound_checkpoint(list(reversed(complete_checkpoints(out))))
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


def setting_problems(resume: str) -> list[str]:
    """What is wrong with a TRAIN_RESUME value, known without reading the checkpoint (stage 1 of the checks)."""
    if resume in MODES or Path(resume).is_dir():
        return []
    return [f"TRAIN_RESUME={resume!r}: no such checkpoint folder; use auto, never or an existing checkpoint-N path"]


def resumable_problems(folder: Path) -> list[str]:
    """Why the run may not continue from `folder` (empty: it may)."""
    try:
        recorded_step(folder)
    except (OSError, ValueError, KeyError, TypeError):
        return [
            f"TRAIN_RESUME={folder}: not a checkpoint folder (no readable {STATE_FILE}); "
            "use auto, never or a checkpoint-N folder"
        ]
    if not (folder / COMPLETE_MARKER).is_file():
        return [
            f"TRAIN_RESUME={folder}: no {COMPLETE_MARKER} marker, so it may be a partial save; "
            f"if you know it is complete, create the file {folder / COMPLETE_MARKER}"
        ]
    return []


# ---- what a checkpoint recorded ------------------------------------------------------------------------------------


def to_record(hub: dict[str, Any]) -> dict[str, Any]:
    """What every checkpoint's marker records of this run, for a later resume: the Hub commits it loaded (RunConfig's
    `hub`, read back by `recorded_hub_commits`). trainer.run.checkpoint adds the step and the time."""
    return {"hub": hub} if hub else {}


def _state(folder: Path) -> dict[str, Any]:
    """trainer_state.json of a checkpoint; OSError or ValueError when it cannot be read."""
    return json.loads((Path(folder) / STATE_FILE).read_text())


def recorded_step(folder: Path) -> int:
    """The global step a checkpoint was saved at; OSError, ValueError or KeyError when it does not say."""
    return int(_state(folder)["global_step"])


def recorded_batch_size(folder: Path) -> int | None:
    """The per-device batch the checkpoint trained with (None when it does not say)."""
    value = _state(folder).get("train_batch_size")
    return int(value) if value else None


def recorded_hub_commits(folder: Path) -> dict[str, dict[str, str]]:
    """{"model": {"repo_id", "sha", ...}, ...}: the Hub commits the marker recorded ({} when unreadable)."""
    try:
        recorded = json.loads((Path(folder) / COMPLETE_MARKER).read_text()).get("hub", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return {key: entry for key, entry in recorded.items() if isinstance(entry, dict)}


def recorded_tracker_runs(folder: Path) -> dict[str, dict[str, str]]:
    """{"wandb": {"run_id", ...}, "mlflow": {...}}: the tracker runs the marker recorded ({} when unreadable); a resumed
    run continues them (trainer.trackers.environment)."""
    try:
        recorded = json.loads((Path(folder) / COMPLETE_MARKER).read_text()).get("trackers", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return {key: entry for key, entry in recorded.items() if isinstance(entry, dict)}


def hub_pins(settings: TrainSettings) -> dict[str, dict[str, str]]:
    """{"model": {repo_id, sha, checkpoint}, ...} from the checkpoint this run will resume from, if any."""
    folder = chosen_checkpoint(settings)
    if folder is None:
        return {}
    return {key: {**entry, "checkpoint": str(folder)} for key, entry in recorded_hub_commits(folder).items()}


# ---- whole ---------------------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def manifest(folder: Path) -> dict[str, dict[str, Any]]:
    """{relative path: {"size", "sha256" (small files)}} of every file in a checkpoint folder, the marker aside."""
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name != COMPLETE_MARKER:
            size = path.stat().st_size
            entry: dict[str, Any] = {"size": size}
            if size <= CHECKSUM_MAX_BYTES:
                entry["sha256"] = _sha256(path)
            files[str(path.relative_to(folder))] = entry
    return files


def damage(folder: Path) -> str | None:
    """What is wrong with a checkpoint the marker calls complete (None: nothing found)."""
    try:
        files = json.loads((folder / COMPLETE_MARKER).read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        return f"its {COMPLETE_MARKER} marker is unreadable"
    if not isinstance(files, dict):
        return None  # written before markers listed files
    for name, entry in files.items():
        path = folder / name
        try:
            size = path.stat().st_size
        except OSError:
            return f"{path} is missing"
        if size != entry.get("size"):
            return f"{path} has {size} bytes, the checkpoint was saved with {entry.get('size')}"
        if "sha256" in entry and _sha256(path) != entry["sha256"]:
            return f"{path} differs from what was saved (sha256)"
    return None


def sound_checkpoint(newest_first: list[Path]) -> Path | None:
    """The newest checkpoint without damage; each damaged one is named in a warning."""
    for folder in newest_first:
        problem = damage(folder)
        if problem is None:
            return folder
        log.warning("resume: %s is damaged (%s); falling back to the previous complete checkpoint", folder, problem)
    return None


def check_whole(folder: Path) -> None:
    """TRAIN_RESUME=PATH: a damaged checkpoint is a ConfigError naming the file."""
    problem = damage(folder)
    if problem:
        raise ConfigError(
            f"TRAIN_RESUME={folder}: the checkpoint is damaged: {problem}. Point TRAIN_RESUME at another checkpoint "
            "(TRAIN_RESUME=auto takes the newest whole one)"
        )


# ---- the same run --------------------------------------------------------------------------------------------------


def _env(name: str) -> str:
    return f"TRAIN_{name.upper()}"


def recorded_settings(settings: Any) -> dict[str, Any]:
    """The TRAIN_* settings a checkpoint records (secrets masked), by field name."""
    values = json.loads(json.dumps(settings.model_dump(), default=str))
    return {k: v for k, v in mask_secrets(values).items() if k not in NOT_COMPARED}


def check_drift(checkpoint: Path, settings: Any, quiet: bool = False) -> None:
    """ConfigError when this run's settings differ from the checkpoint's in a way it cannot continue with; the
    changes it may continue with are logged (unless `quiet`)."""
    try:
        before = json.loads((checkpoint / COMPLETE_MARKER).read_text()).get("settings")
    except (OSError, ValueError, AttributeError):
        before = None
    if not isinstance(before, dict):
        if not quiet:
            log.info("resume: %s recorded no settings (an older trainkit): changes are not checked", checkpoint)
        return
    now = recorded_settings(settings)
    changed = {k: (before[k], now[k]) for k in sorted(before.keys() & now.keys()) if before[k] != now[k]}
    named = {k: f"{_env(k)} was {old!r}, now {new!r}" for k, (old, new) in changed.items()}
    fresh = "or start a new run: another TRAIN_OUTPUT_DIR, or TRAIN_RESUME=never with TRAIN_START_OVER=1 here"
    blocking = [named[k] for k in changed if k in CANNOT_CHANGE]
    if blocking:
        raise ConfigError(*blocking, f"{checkpoint} cannot continue with these changes: restore them, {fresh}")
    data = [named[k] for k in changed if k in DATA_CHANGES]
    if data and not getattr(settings, "resume_changed_data", False):
        raise ConfigError(
            *data,
            f"these change the training data or its order from what {checkpoint} trained on: restore them, {fresh}, "
            "or set TRAIN_RESUME_CHANGED_DATA=1 to continue on the changed data",
        )
    if changed and not quiet:
        log.info("resume: continuing with changed settings: %s", "; ".join(named.values()))


# ---- a used folder -------------------------------------------------------------------------------------------------


def earlier_outputs(output_dir: Path) -> list[Path]:
    """An earlier run's checkpoints (complete or not) and final/ in `output_dir`."""
    if not output_dir.is_dir():
        return []
    found = sorted((p for p in output_dir.iterdir() if p.is_dir() and checkpoint_step(p) is not None),
                   key=lambda p: checkpoint_step(p) or 0)  # fmt: skip
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
    """TRAIN_START_OVER=1: move the earlier run's checkpoints, final/ and metrics.jsonl to previous-runs/<time>/
    (nothing is deleted). Called by the process that writes, once the output folder is locked."""
    earlier = earlier_outputs(output_dir)
    if not earlier:
        return
    aside = output_dir / PREVIOUS_RUNS / time.strftime("%Y%m%d-%H%M%S")
    aside.mkdir(parents=True, exist_ok=True)
    for path in [*earlier, output_dir / "metrics.jsonl"]:
        if path.exists():
            os.rename(path, aside / path.name)
    log.warning("TRAIN_START_OVER: the earlier run (%s, metrics.jsonl) moved to %s; starting over",
                ", ".join(p.name for p in earlier), aside)  # fmt: skip


def archive_run_config(output_dir: Path) -> None:
    """Keep the previous start's run_config.json as run_configs/run_config-<time>.json before a new one is written."""
    current = output_dir / RUN_CONFIG
    if not current.is_file():
        return
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(current.stat().st_mtime))
    target = output_dir / RUN_CONFIGS / f"run_config-{stamp}.json"
    target.parent.mkdir(exist_ok=True)
    n = 1
    while target.exists():
        n += 1
        target = target.with_name(f"run_config-{stamp}-{n}.json")
    os.rename(current, target)
