"""Whether a run may continue from a checkpoint: is it whole, and is it the same run (torch-free).

- Whole: the `trainkit_complete` marker lists every file of the checkpoint with its size, and a sha256 for files up
  to CHECKSUM_MAX_BYTES (the states and configs; hashing the weights would cost a read of the whole model on every
  save). `damage(folder)` names the first file that is missing, of another size or another content. Markers of
  older trainkit versions list no files: they are taken as they are.
- The same run: the marker records the TRAIN_* settings (secrets masked). On resume, `check_drift` compares them:
  a change the checkpoint cannot continue with (CANNOT_CHANGE: model, tokenizer, LoRA, quantization, sharding) exits
  2 naming each variable; a change of the training data or its order (DATA_CHANGES) too, unless
  TRAIN_RESUME_CHANGED_DATA=1 says so; any other change goes on, with one log line naming it.
- A used folder and TRAIN_RESUME=never: the earlier run's checkpoints would mix with the new ones (rotation, auto
  resume). `refuse_or_set_aside` exits 2 unless TRAIN_START_OVER=1, which moves them to `previous-runs/<time>/`.
- run_config.json of each earlier start is kept (`archive_run_config`), never overwritten.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from trainer.errors import ConfigError
from trainer.secrets import mask_secrets

log = logging.getLogger("trainer")

COMPLETE_MARKER = "trainkit_complete"
CHECKSUM_MAX_BYTES = 1 << 20
CANNOT_CHANGE = ("model", "tokenizer", "lora", "lora_r", "lora_alpha", "lora_targets", "quant", "zero_stage", "fsdp")
# What the run trains on, and in which order (the sampler's seed, the global batch).
DATA_CHANGES = ("data", "text_field", "seq_len", "data_max_bad_lines", "seed", "batch_size", "grad_accum",
                "nproc_per_node")  # fmt: skip
NOT_COMPARED = ("resume", "output_dir", "resume_changed_data", "start_over")
PREVIOUS_RUNS = "previous-runs"
RUN_CONFIG = "run_config.json"
RUN_CONFIGS = "run_configs"


def _env(name: str) -> str:
    return f"TRAIN_{name.upper()}"


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


def earlier_outputs(output_dir: Path, checkpoints: list[Path]) -> list[Path]:
    final = output_dir / "final"
    return [*checkpoints, final] if final.is_dir() else list(checkpoints)


def refuse_or_set_aside(output_dir: Path, checkpoints: list[Path], start_over: bool) -> None:
    """TRAIN_RESUME=never in a folder with an earlier run's checkpoints: ConfigError, or (TRAIN_START_OVER=1) move
    them, final/ and metrics.jsonl to previous-runs/<time>/ (nothing is deleted)."""
    earlier = earlier_outputs(output_dir, checkpoints)
    if not earlier:
        return
    names = ", ".join(p.name for p in earlier)
    if not start_over:
        raise ConfigError(
            f"TRAIN_RESUME=never, but TRAIN_OUTPUT_DIR={output_dir} holds an earlier run ({names}): its checkpoints "
            "would mix with this run's. TRAIN_RESUME=auto continues it; TRAIN_START_OVER=1 moves it aside to "
            f"{output_dir / PREVIOUS_RUNS}/ and starts over here; or use another TRAIN_OUTPUT_DIR"
        )
    aside = output_dir / PREVIOUS_RUNS / time.strftime("%Y%m%d-%H%M%S")
    aside.mkdir(parents=True, exist_ok=True)
    for path in [*earlier, output_dir / "metrics.jsonl"]:
        if path.exists():
            os.rename(path, aside / path.name)
    log.warning("TRAIN_START_OVER: the earlier run (%s, metrics.jsonl) moved to %s; starting over", names, aside)


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
