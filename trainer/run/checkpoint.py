"""Atomic checkpoints.

Transformers' `Trainer._save_checkpoint` writes `<run_dir>/checkpoint-N/` file by file, so a crash
mid-save leaves a folder that `get_last_checkpoint` and `rotate_checkpoints` take for a checkpoint
(the newest one is even protected from rotation). `AtomicCheckpointTrainer` points that save at a
staging folder instead: `OUTPUT_DIR/.tmp-checkpoint-N/checkpoint-N/`. Rotation inside the staging
folder sees one checkpoint and deletes nothing. When every rank is done, the main process writes the
checkpoint's record (trainer.checkpoint_record: its marker, with the files and their hashes), fsyncs the files,
renames the folder to `OUTPUT_DIR/checkpoint-N` (one atomic rename on the same filesystem) and only then rotates the
real checkpoints. So a `checkpoint-N` folder exists only when complete; `.tmp-*` leftovers of a killed save are
deleted on the next start. Resume additionally requires the record, which guards against folders copied in by hand;
whether a run may continue from a checkpoint is trainer.config.resume's to say.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.checkpoint_record import CheckpointRecord, state_path, write_record
from trainer.provenance import reference as provenance_reference

if TYPE_CHECKING:
    from torch.nn import Module
    from transformers import PreTrainedTokenizerBase, TrainerControl, TrainerState, TrainingArguments

log = logging.getLogger("trainer")

TMP_PREFIX = ".tmp-"
# Test hook: "SECONDS@STEP" (or "SECONDS@*" for every save) sleeps inside a save, before its record, so a test
# can signal or kill -9 the trainer mid-save.
SAVE_DELAY_ENV = "TRAINKIT_TEST_SAVE_DELAY"


def _test_save_delay(step: int) -> float:
    seconds, _, at = os.environ.get(SAVE_DELAY_ENV, "").partition("@")
    return float(seconds) if seconds and at and (at == "*" or int(at) == step) else 0.0


def fsync_tree(root: Path) -> None:
    """Flush every file and folder under root (and root) to disk."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on folders
    finally:
        os.close(fd)


def remove_stale_temps(output_dir: str | Path) -> list[Path]:
    """Delete `.tmp-*` folders left by a save that was killed; returns what was removed."""
    root = Path(output_dir)
    removed = []
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith(TMP_PREFIX) and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
    for p in removed:
        log.info("checkpoint: removed %s, left by an interrupted save", p)
    return removed


def publish(staged: Path, final: Path, run: CheckpointRecord, step: int, final_model: bool = False) -> None:
    """Record `staged` complete (the run's record at `step`), flush it, and move it to `final` with one rename."""
    write_record(staged, replace(run, provenance=provenance_reference(final.parent)), step, final=final_model)
    fsync_tree(staged)
    if final.exists():  # e.g. a run restarted with TRAIN_RESUME=never reaches the same step
        old = final.with_name(f"{TMP_PREFIX}old-{final.name}")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
        os.rename(staged, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(staged, final)
    fsync_dir(final.parent)


def __getattr__(name: str) -> Any:
    # The Trainer subclass is built on first use, so the path helpers above stay importable without transformers.
    if name == "AtomicCheckpointTrainer":
        from transformers import Trainer

        cls = atomic_trainer(Trainer)
        globals()[name] = cls
        return cls
    raise AttributeError(name)


@functools.cache  # one subclass per base
def atomic_trainer(base: type) -> type:
    """`base` (Transformers' Trainer, or a subclass such as TRL's DPOTrainer) with atomic checkpoints and final/."""
    from trainer.compat import rotate_checkpoints
    from trainer.run.disk_space import full_disk_ends_run

    class AtomicCheckpointTrainer(base):
        """Trainer whose checkpoints appear only complete (see the module docstring)."""

        _staging_dir: str | None = None
        checkpoint_record: CheckpointRecord | None = None  # set per run (train.py): what each checkpoint records

        def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
            """A training line gets the fields of the callbacks that add some (`log_fields`: router health) before
            any callback sees it (trackers included)."""
            if "loss" in logs:
                for callback in self.callback_handler.callbacks:
                    if hasattr(callback, "log_fields"):
                        logs.update(callback.log_fields(self.state))
            super().log(logs, *args, **kwargs)

        def get_train_dataloader(self) -> Any:
            from trainer.run.signals import shield_workers

            return shield_workers(super().get_train_dataloader())

        def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
            # A compiled run drops the partial last batch in training only (trainer.run.kit.batches_per_epoch):
            # every evaluation sequence is evaluated.
            dropping, self.args.dataloader_drop_last = self.args.dataloader_drop_last, False
            try:
                return super().get_eval_dataloader(eval_dataset)
            finally:
                self.args.dataloader_drop_last = dropping

        def _get_output_dir(self, trial: Any) -> str:
            if self._staging_dir is not None:
                return self._staging_dir
            return super()._get_output_dir(trial)

        def _save_checkpoint(self, model: Module, trial: Any, *more: Any, **named: Any) -> None:
            # transformers 4.46 passes metrics=, later versions do not: hand on whatever this version passes.
            guards = [c for c in self.callback_handler.callbacks if hasattr(c, "allows_save")]
            if not all([c.allows_save(self.state, self.control, model) for c in guards]):
                return  # no checkpoint of a diverged run (trainer.run.divergence); the loop ends after this step
            run_dir = Path(super()._get_output_dir(trial))
            step = self.state.global_step
            staging = run_dir / f"{TMP_PREFIX}checkpoint-{step}"
            if self.args.should_save:
                shutil.rmtree(staging, ignore_errors=True)
                staging.mkdir(parents=True)
            self.accelerator.wait_for_everyone()
            started = time.perf_counter()
            final = run_dir / f"checkpoint-{step}"
            with full_disk_ends_run(run_dir, f"saving {final.name}", staging if self.args.should_save else None):
                self._save_staged(model, trial, staging, final, step, *more, **named)
            self.accelerator.wait_for_everyone()
            if self.args.should_save:
                rotate_checkpoints(self, str(run_dir))
                log.info("checkpoint: %s complete (%.2fs)", final, time.perf_counter() - started)
            self.accelerator.wait_for_everyone()

        def _save(self, output_dir: str | None = None, state_dict: Any = None) -> None:
            if self._staging_dir is None:  # final/ and save_model: the original layout, for every other tool
                return super()._save(output_dir, state_dict)
            from trainer.library_patches import saving_in_model_names

            unwrapped = self.accelerator.unwrap_model(self.model, keep_torch_compile=False)
            with saving_in_model_names(self.model, unwrapped):  # a checkpoint: as its resume loads it back
                return super()._save(output_dir, state_dict)

        def _issue_warnings_after_load(self, load_result: Any) -> None:
            super()._issue_warnings_after_load(load_result)
            lost = weights_not_loaded(self.model, load_result.missing_keys)
            if lost:
                named = ", ".join(lost[:3]) + (", ..." if len(lost) > 3 else "")
                raise RuntimeError(f"the checkpoint left {len(lost)} of the model's weights unloaded ({named}): "
                                   "resuming would train from other weights")  # fmt: skip

        def _save_staged(self, model: Module, trial: Any, staging: Path, final: Path, step: int, *more: Any,
                         **named: Any) -> None:  # fmt: skip
            self._staging_dir = str(staging)
            try:
                super()._save_checkpoint(model, trial, *more, **named)
            finally:
                self._staging_dir = None
            self._best_outside_staging(staging, final)
            time.sleep(_test_save_delay(step))
            self.accelerator.wait_for_everyone()
            if self.args.should_save:
                publish(staging / final.name, final, self._run_record(), step)
                shutil.rmtree(staging, ignore_errors=True)

        def _best_outside_staging(self, staging: Path, final: Path) -> None:
            """Transformers names the best checkpoint (TRAIN_KEEP_BEST) by the folder it saved into, the staging one:
            point it at the published folder, in the state and in the state file being published."""
            best = self.state.best_model_checkpoint
            if not best or Path(best).parent != staging:
                return
            self.state.best_model_checkpoint = str(final.parent / Path(best).name)
            if self.args.should_save:
                self.state.save_to_json(str(state_path(staging / final.name)))

        def save_final(self, output_dir: Path, tokenizer: PreTrainedTokenizerBase) -> None:
            """Model + tokenizer to `output_dir`, published atomically like a checkpoint.

            LoRA on a full-precision base (one process, no DeepSpeed/FSDP): `final/` holds the merged model,
            loadable with from_pretrained, and `final/adapter/` the adapter. On a quantized base the adapter is it.
            """
            staging = output_dir.with_name(f"{TMP_PREFIX}{output_dir.name}")
            if self.args.should_save:
                shutil.rmtree(staging, ignore_errors=True)
            partial = staging if self.args.should_save else None
            with full_disk_ends_run(output_dir.parent, f"saving {output_dir.name}/", partial):
                self._save_final_staged(staging, output_dir, tokenizer)
            self.accelerator.wait_for_everyone()

        def _save_final_staged(self, staging: Path, output_dir: Path, tokenizer: PreTrainedTokenizerBase) -> None:
            from trainer.model.expert_adapters import merge_into_base

            if self._can_merge_lora():
                self.save_model(str(staging / "adapter"))
                merged = merge_into_base(self.model)
                if self.args.should_save:
                    merged.save_pretrained(str(staging))
                log.info("LoRA: final/ holds the merged model, final/adapter/ the adapter")
            else:
                self.save_model(str(staging))
            if self.args.should_save:
                tokenizer.save_pretrained(str(staging))
                publish(staging, output_dir, self._run_record(), self.state.global_step, final_model=True)

        def _run_record(self) -> CheckpointRecord:
            return self.checkpoint_record if self.checkpoint_record is not None else CheckpointRecord()

        def _can_merge_lora(self) -> bool:
            model = self.model
            if not hasattr(model, "merge_and_unload") or self.is_deepspeed_enabled or self.is_fsdp_enabled:
                return False
            base = model.get_base_model()
            return not (getattr(base, "is_loaded_in_4bit", False) or getattr(base, "is_loaded_in_8bit", False))

    return AtomicCheckpointTrainer


def weights_not_loaded(model: Module, missing: list[str]) -> list[str]:
    """The missing keys of a load that name a weight no loaded key shares (a tied LM head missing is fine: its
    embedding was loaded)."""
    names: dict[int, list[str]] = {}
    params = dict(model.named_parameters(remove_duplicate=False))
    for name, param in params.items():
        names.setdefault(id(param), []).append(name)
    absent = set(missing)
    return [name for name in missing if name not in params or all(n in absent for n in names[id(params[name])])]


def steps_from_settings() -> Any:
    """A callback that gives a resumed run the save, logging and eval intervals of its own settings. Transformers takes
    them from the checkpoint's saved trainer state on resume (and only warns), so a TRAIN_SAVE_STEPS changed for the
    resumed run would be logged as in force and never used."""
    import math

    from transformers import TrainerCallback

    class StepsFromSettings(TrainerCallback):
        def on_train_begin(
            self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
        ) -> None:
            for name in ("logging_steps", "eval_steps", "save_steps"):
                value = getattr(args, name)
                if name == "eval_steps" and value is None:
                    value = args.logging_steps  # Transformers' rule: eval follows logging unless given
                if value is not None:
                    setattr(state, name, math.ceil(state.max_steps * value) if value < 1 else int(value))

    return StepsFromSettings()
