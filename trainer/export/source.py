"""What `export` was given: a run folder (its final/, else its newest complete checkpoint), a checkpoint, or final/;
and what that folder holds. Reads only JSON and file names (no torch)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.checkpoint_record import (
    CheckpointRecord,
    checkpoint_step,
    complete_checkpoints,
    has_record,
    has_trainer_state,
    holds_full_model,
    read_record,
)  # fmt: skip
from trainer.errors import ConfigError

ADAPTER = "adapter"  # a LoRA adapter (a checkpoint, or final/adapter/), merged into its recorded base
ZERO = "zero"  # DeepSpeed ZeRO shards (global_step*/), consolidated with zero_to_fp32
FSDP = "fsdp"  # FSDP sharded state dict (pytorch_model_fsdp_*/, torch DCP), consolidated with accelerate
FULL = "full"  # a whole model already (config.json + weights)


@dataclass
class Source:
    folder: Path  # the checkpoint or final/ folder read
    kind: str
    run_dir: Path | None  # the run folder holding run_config.json and metrics.jsonl, when known
    run_config: dict[str, Any] = field(default_factory=dict)
    record: CheckpointRecord = field(default_factory=CheckpointRecord)  # what the checkpoint recorded
    adapter: Path | None = None  # where the adapter lives for ADAPTER

    @property
    def step(self) -> int | None:
        return self.record.step if self.record.step is not None else checkpoint_step(self.folder)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _pick_from_run(run: Path, command: str) -> Path:
    final = run / "final"
    if has_record(final):
        return final
    complete = complete_checkpoints(run)
    if not complete:
        raise ConfigError(f"{command} {run}: a run folder without final/ or a checkpoint-N/ recorded as complete; give "
                          "a checkpoint folder instead")  # fmt: skip
    return complete[-1]


def _kind(folder: Path, adapter_only: bool, command: str) -> tuple[str, Path | None]:
    if (folder / "adapter_config.json").is_file():
        return ADAPTER, folder
    # final/ of a LoRA run the trainer could merge itself: the merged model, and its adapter in adapter/
    if (folder / "adapter" / "adapter_config.json").is_file() and (adapter_only or not holds_full_model(folder)):
        return ADAPTER, folder / "adapter"
    if any(p.is_dir() and any(p.glob("*model_states.pt")) for p in folder.glob("global_step*")):
        return ZERO, None
    if any(p.is_dir() for p in folder.glob("pytorch_model_fsdp_*")):
        return FSDP, None
    if holds_full_model(folder):
        return FULL, None
    raise ConfigError(f"{command} {folder}: no model in it (no adapter_config.json, ZeRO global_step*/ shards, FSDP "
                      "pytorch_model_fsdp_*/ shards, or config.json with weights)")  # fmt: skip


def resolve_source(src: Path, adapter_only: bool = False, command: str = "export") -> Source:
    """SRC -> Source; ConfigError (exit 2) when it is none of the accepted forms (`command` names the asking
    command in the message)."""
    if not src.is_dir():
        raise ConfigError(f"{command} {src}: no such folder; give a run folder, a checkpoint-N folder or final/")
    is_run = (
        (src / "run_config.json").is_file()
        and not has_trainer_state(src)
        and not (src / "config.json").is_file()
    )
    folder = _pick_from_run(src, command) if is_run else src
    run_dir = folder.parent if (folder.parent / "run_config.json").is_file() else None
    kind, adapter = _kind(folder, adapter_only, command)
    return Source(
        folder=folder, kind=kind, run_dir=run_dir, adapter=adapter,
        run_config=_read_json(run_dir / "run_config.json") if run_dir else {},
        record=read_record(folder) or CheckpointRecord(),
    )  # fmt: skip
