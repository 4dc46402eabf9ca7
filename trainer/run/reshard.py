"""A resume on another process count, applied to the run (trainer.config.resume.continuation decides it): the
accumulation that keeps the checkpoint's effective batch, and sharded state made readable on the new count.

Full state dicts need nothing: DDP's, and FSDP's as trainkit configures it (Transformers' FULL_STATE_DICT: whole
weights and a whole optimizer state, sharded again as FSDP loads them). DeepSpeed ZeRO saves each rank's partition of
the optimizer state and refuses another data-parallel size; its universal checkpoint (deepspeed.checkpoint.
ds_to_universal: one folder per parameter) loads onto any, with `checkpoint.load_universal` in the DeepSpeed config.
Global rank 0 converts the checkpoint once into OUTPUT_DIR/.reshard/checkpoint-N (the checkpoint's other files linked
in, the checkpoint itself untouched), every rank loads it, and rank 0 removes it when training ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from trainer.checkpoint_record import BatchRecord
from trainer.config.decision import Decision
from trainer.config.resume import Continuation, Resume, continuation

if TYPE_CHECKING:
    from transformers import TrainingArguments

    from trainer.config.run_config import RunConfig

RESHARD_DIR = ".reshard"
DEEPSPEED_LATEST = "latest"  # DeepSpeed's file naming the tag (global_stepN) of the checkpoint in a folder

log = logging.getLogger("trainer")


def processes() -> int:
    """This run's process count: torchrun's WORLD_SIZE, or 1 (a lone process, given WORLD_SIZE=1 for ZeRO/FSDP)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def continue_on_this_count(cfg: RunConfig, resume: Resume) -> tuple[RunConfig, Continuation]:
    """The run with the accumulation that keeps the resumed checkpoint's effective batch and, for ZeRO on another
    process count, DeepSpeed told to load a universal checkpoint; a ConfigError when it cannot go on (exit 2)."""
    count = processes()
    plan = continuation(resume.checkpoint, cfg.settings, count, cfg.decisions.grad_accum.value)
    if plan.note:
        log.info("resume: %s", plan.note)
    if plan.accumulation != cfg.decisions.grad_accum.value:
        why = f"resume on {count} process(es): keeps the effective batch of {resume.checkpoint}"
        decisions = dataclasses.replace(cfg.decisions, grad_accum=Decision(plan.accumulation, why))
        arguments = {**cfg.training_arguments, "gradient_accumulation_steps": plan.accumulation}
        cfg = dataclasses.replace(cfg, decisions=decisions, training_arguments=arguments)
    if plan.reshard_from is not None and cfg.deepspeed:
        ds = {**cfg.deepspeed, "checkpoint": {**cfg.deepspeed.get("checkpoint", {}), "load_universal": True}}
        cfg = dataclasses.replace(cfg, deepspeed=ds, training_arguments={**cfg.training_arguments, "deepspeed": ds})
    return cfg, plan


def batch_record(plan: Continuation, args: TrainingArguments) -> BatchRecord:
    """What each checkpoint of this run records of its batch: the one it trains with (after any batch search)."""
    return dataclasses.replace(plan.batch, processes=args.world_size, per_device=args.per_device_train_batch_size,
                               accumulation=args.gradient_accumulation_steps)  # fmt: skip


@contextlib.contextmanager
def checkpoint_to_load(
    cfg: RunConfig, plan: Continuation, resume: Resume, args: TrainingArguments
) -> Iterator[str | None]:
    """The folder Transformers resumes from: the checkpoint, or its universal form for ZeRO on another process
    count (made by global rank 0 while the others wait; removed at the end)."""
    if resume.checkpoint is None or plan.reshard_from is None or not cfg.deepspeed:
        yield str(resume.checkpoint) if resume.checkpoint else None
        return
    folder = Path(cfg.settings.output_dir) / RESHARD_DIR / resume.checkpoint.name
    if args.process_index == 0:
        universal_checkpoint(resume.checkpoint, folder, plan.reshard_from)
    _wait_for_everyone()
    try:
        yield str(folder)
    finally:  # every rank loaded it at the start of training
        if args.process_index == 0:
            shutil.rmtree(folder.parent, ignore_errors=True)


def universal_checkpoint(checkpoint: Path, folder: Path, saved_by: int) -> None:
    """DeepSpeed's universal checkpoint of `checkpoint` in `folder`, beside links to its other files."""
    from deepspeed.checkpoint.ds_to_universal import main as ds_to_universal

    tag = (checkpoint / DEEPSPEED_LATEST).read_text().strip()
    staging = folder.with_name(f"{folder.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.rmtree(folder, ignore_errors=True)
    staging.mkdir(parents=True)
    for entry in checkpoint.iterdir():
        if entry.name not in (tag, DEEPSPEED_LATEST):
            (staging / entry.name).symlink_to(entry.resolve())
    started = time.perf_counter()
    options = SimpleNamespace(input_folder=str(checkpoint / tag), output_folder=str(staging / f"{tag}_universal"),
                              num_extract_workers=1, num_merge_workers=1, keep_temp_folder=False, strict=True,
                              inject_missing_state=True)  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):  # its progress report; the outcome is logged here
        ds_to_universal(options)
    os.rename(staging, folder)
    log.info("resume: DeepSpeed's %d-process ZeRO state of %s converted to its universal checkpoint (%s, %.1fs)",
             saved_by, checkpoint, folder, time.perf_counter() - started)  # fmt: skip


def _wait_for_everyone() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
