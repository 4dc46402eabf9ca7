"""Resume, decided in one place: what a run continues from, what a checkpoint recorded, whether it may continue.

- What to resume (`decide`, `chosen_checkpoint`): TRAIN_RESUME=never starts from scratch, auto takes the newest
  complete checkpoint of TRAIN_OUTPUT_DIR (none: from scratch), a path names the checkpoint folder.
- What a checkpoint recorded: its step and batch (`trainer_state.json`, read here only) and the Hub commits of the
  run that wrote it (the `trainkit_complete` marker's `hub` entry, which pins a resumed run: trainer.hub.sources).
- Whether the run may continue from a folder (`resumable_problems`): a readable trainer_state.json and the marker.

Torch-free and imports nothing of trainkit above trainer.errors: stage 1 of the configuration (trainer.config.checks)
and the Hub resolution ask it before anything heavy is loaded. The run (train.py, batch_search.py), the checkpoint
writer (checkpoint.py) and the checks all ask it; none of them reads these files itself.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.errors import ConfigError

if TYPE_CHECKING:
    from trainer.config.schema import TrainSettings

COMPLETE_MARKER = "trainkit_complete"  # written last into every published checkpoint (trainer.run.checkpoint)
STATE_FILE = "trainer_state.json"  # Transformers' record of the step, the batch, the best checkpoint
MODES = ("auto", "never")  # TRAIN_RESUME's words; anything else is a checkpoint folder
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


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
        return newest_complete_checkpoint(settings.output_dir)
    return Path(settings.resume)


def decide(settings: TrainSettings) -> Resume:
    """What this run continues from; a TRAIN_RESUME path the run may not continue from is a ConfigError (exit 2)."""
    folder = chosen_checkpoint(settings)
    if settings.resume == "never":
        return Resume(None, "TRAIN_RESUME=never, starting from scratch")
    if folder is None:
        return Resume(None, f"no complete checkpoint in {settings.output_dir}, starting from scratch")
    if settings.resume == "auto":
        return Resume(folder, f"continuing from {folder} (newest complete checkpoint)")
    problems = resumable_problems(folder)
    if problems:
        raise ConfigError(*problems)
    return Resume(folder, f"continuing from {folder} (TRAIN_RESUME)")


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


def hub_pins(settings: TrainSettings) -> dict[str, dict[str, str]]:
    """{"model": {repo_id, sha, checkpoint}, ...} from the checkpoint this run will resume from, if any."""
    folder = chosen_checkpoint(settings)
    if folder is None:
        return {}
    return {key: {**entry, "checkpoint": str(folder)} for key, entry in recorded_hub_commits(folder).items()}
