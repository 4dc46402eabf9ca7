"""What `export` (and generate, eval) was given: a run folder (its final/, else its newest complete checkpoint), a
checkpoint, or final/; and what that folder holds. Reads only JSON and file names (no torch); the run's record through
trainer.config.run_record.

A damaged folder is refused here, before any work, naming the file: one whose completion record
(trainer.checkpoint_record) lists files that are now missing, of another size or other content, and any folder whose
JSON files (the config, the tokenizer's, the adapter's) do not read as JSON objects."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from trainer.checkpoint_record import (
    CheckpointRecord,
    checkpoint_step,
    complete_checkpoints,
    damage,
    has_record,
    has_trainer_state,
    holds_full_model,
    read_record,
)  # fmt: skip
from trainer.config import run_record
from trainer.config.run_record import RunRecord
from trainer.errors import ConfigError

ADAPTER = "adapter"  # a LoRA adapter (a checkpoint, or final/adapter/), merged into its recorded base
ZERO = "zero"  # DeepSpeed ZeRO shards (global_step*/), consolidated with zero_to_fp32
FSDP = "fsdp"  # FSDP sharded state dict (pytorch_model_fsdp_*/, torch DCP), consolidated with accelerate
FULL = "full"  # a whole model already (config.json + weights)
JSON_FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.json",
              "special_tokens_map.json", "adapter_config.json")  # fmt: skip


@dataclass
class Source:
    folder: Path  # the checkpoint or final/ folder read
    kind: str
    run_dir: Path | None  # the run folder holding the run's record and metrics.jsonl, when known
    run: RunRecord | None = None  # the run's record (run_config.json), when known
    record: CheckpointRecord = field(default_factory=CheckpointRecord)  # what the checkpoint recorded
    adapter: Path | None = None  # where the adapter lives for ADAPTER

    @property
    def step(self) -> int | None:
        return self.record.step if self.record.step is not None else checkpoint_step(self.folder)


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
    is_run = run_record.present(src) and not has_trainer_state(src) and not (src / "config.json").is_file()
    folder = _pick_from_run(src, command) if is_run else src
    run_dir = folder.parent if run_record.present(folder.parent) else None
    run = run_record.read(run_dir) if run_dir else None  # first: a damaged record stops every command the same way
    _refuse_damaged(src, folder, command)
    kind, adapter = _kind(folder, adapter_only, command)
    return Source(folder=folder, kind=kind, run_dir=run_dir, adapter=adapter, run=run,
                  record=read_record(folder) or CheckpointRecord())  # fmt: skip


def _refuse_damaged(src: Path, folder: Path, command: str) -> None:
    """ConfigError naming the file: what the folder's record lists and no longer holds, or a JSON file that does not
    read (a torn copy)."""
    problem = damage(folder) if has_record(folder) else None
    if problem:  # its record lists every file's size: a truncated copy is named before any weights are read
        raise ConfigError(f"{command} {src}: {problem}; copy it again, or use another checkpoint of the run")
    for file in [folder / name for name in JSON_FILES] + [folder / "adapter" / name for name in JSON_FILES]:
        if file.is_file():
            try:
                readable = isinstance(json.loads(file.read_text()), dict)
            except (OSError, UnicodeDecodeError, ValueError) as exc:
                raise ConfigError(f"{command} {src}: {file} does not read as JSON ({str(exc)[:120]}); copy it "
                                  "again, or use another checkpoint of the run") from None  # fmt: skip
            if not readable:
                raise ConfigError(f"{command} {src}: {file} holds no JSON object; copy it again, or use another "
                                  "checkpoint of the run")  # fmt: skip
