"""TRAIN_ON_NAN: a diverged run (a non-finite loss or gradient norm) never passes for a finished one.

`DivergenceGuard`, a TrainerCallback, watches the gradients just before each optimizer step (after clipping) and
the logged loss. With `stop` (the default) it asks nothing of the host per step: each step adds "were the
gradients finite" to a counter on the device, read only where a decision needs it (a logging or evaluating step,
the start of a checkpoint save through `allows_save`, which trainer.run.checkpoint asks, and the end of
training). Gradients go non-finite before the weights do (the optimizer step after them
writes NaN into every weight), so a save is cancelled before it could hold non-finite weights; the weights are
checked too, once per save. The run then ends without a checkpoint of the diverged weights (the newest checkpoint,
the last finite one, is never rotated away), without final/ and without a push, and exits EXIT_DIVERGED; it
records where and why, and a digest of the settings, in OUTPUT_DIR/diverged.json. A restart with the same settings
(torchrun's TRAIN_MAX_RESTARTS, compose's restart policy, the user) would diverge the same way from the same
checkpoint: it exits EXIT_DIVERGED at once, before torch loads, asking for a change. The launcher reports
EXIT_DIVERGED where torchrun itself exits 1.

With `skip`, a step whose gradients are not finite is skipped, as fp16's loss scaler does (its gradients are
dropped, so the optimizer leaves the weights and its moments as they were): one host read per step. After
MAX_SKIPS_IN_A_ROW in a row the run stops as with `stop`.

Where the gradients are not plain `param.grad` tensors (DeepSpeed) or fp16's scaler already skips steps with
non-finite gradients, the guard watches the logged loss only (a diverged run's loss is NaN at its next log).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.errors import EXIT_DIVERGED

if TYPE_CHECKING:
    import torch
    from torch.nn import Module
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from trainer.config.schema import TrainSettings

log = logging.getLogger("trainer")

MAX_SKIPS_IN_A_ROW = 10
RECORD = "diverged.json"  # OUTPUT_DIR/diverged.json: where and why the run diverged, and with which settings


def _local(tensor: Any) -> Any:
    """A DTensor's local shard (FSDP2); any other tensor as it is."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def all_finite(tensors: Iterable[Any]) -> Any:
    """A 0-d bool tensor on the tensors' device, True when every element is finite; None for no tensors. No host
    read: the norms run on the device (a NaN or Inf anywhere makes its tensor's norm non-finite)."""
    import torch

    local = [_local(t).detach() for t in tensors if t is not None and t.numel() and t.is_floating_point()]
    if not local:
        return None
    norms = torch._foreach_norm(local)
    device = norms[0].device
    return torch.stack([n.to(device, torch.float32) for n in norms]).isfinite().all()


def settings_digest(settings: TrainSettings) -> str:
    """A digest of the TRAIN_* settings: the same digest, the same run (its data order and weights included)."""
    text = json.dumps(settings.model_dump(mode="json"), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def retried_after_divergence(output_dir: Path, settings: TrainSettings) -> bool:
    """True when this output folder's last run diverged with these same settings (OUTPUT_DIR/diverged.json): it would
    diverge again from the same checkpoint, so a restart by torchrun (TRAIN_MAX_RESTARTS), compose
    (restart: on-failure) or the user exits EXIT_DIVERGED at once, asking for a change instead of training."""
    try:
        record = json.loads((output_dir / RECORD).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(record, dict) or record.get("settings") != settings_digest(settings):
        return False
    log.error("%s: this run diverged at step %s (%s) with these same settings, and would again: change TRAIN_LR "
              "(or the warmup, or TRAIN_ON_NAN=skip) and start it again, or delete %s to retry as it is; exit %d",
              output_dir / RECORD, record.get("step"), record.get("reason"), RECORD, EXIT_DIVERGED)  # fmt: skip
    return True


def _agreed(*values: Any) -> Any:
    """The largest of each value over all ranks (one all-reduce on the default group), so that every rank takes the
    same decision; one process: the values themselves. Returns a tensor of them."""
    import torch

    stacked = torch.stack([v.to(torch.int64).reshape(()) for v in values])
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(stacked, op=dist.ReduceOp.MAX)
    return stacked if len(values) > 1 else stacked[0]


def __getattr__(name: str) -> Any:
    # The callback class is built on first use, so that retried_after_divergence stays importable without torch
    # and transformers (`python -m trainer train` asks it before they load).
    if name == "DivergenceGuard":
        cls = _guard_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


def _guard_class() -> type:
    from transformers import TrainerCallback

    class DivergenceGuard(TrainerCallback):
        """Detects a diverged run and ends it per TRAIN_ON_NAN (see the module docstring)."""

        def __init__(self, policy: str, watch_gradients: bool = True) -> None:
            self.policy = policy
            self.watch_gradients = watch_gradients
            self._bad_steps: torch.Tensor | None = None  # device tensor: optimizer steps with non-finite gradients
            self._first_bad: torch.Tensor | None = None  # device tensor: the first such step (0: none)
            self.skipped = 0
            self.skipped_in_a_row = 0
            self.diverged_at: int | None = None
            self.reason = ""
            self.last_finite_loss: float | None = None
            self.last_finite_step: int | None = None

        # ---- per step: on the device only (stop) or one host read (skip) ----

        def on_pre_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                                  model: Module | None = None, **kwargs: object) -> Any:  # fmt: skip
            if not self.watch_gradients or model is None or self.diverged_at is not None:
                return control
            params = [p for p in model.parameters() if p.grad is not None]
            finite = all_finite(p.grad for p in params)
            if finite is None:
                return control
            step = state.global_step + 1  # the step this optimizer step completes
            if self.policy == "skip":
                self._skip_or_not(params, not bool(_agreed(~finite)), step)
                return control
            import torch

            bad = (~finite).to(torch.int32)
            if self._bad_steps is None:
                self._bad_steps, self._first_bad = bad.clone(), bad * step
            else:
                self._first_bad = torch.where((self._first_bad == 0) & (bad > 0), step, self._first_bad)
                self._bad_steps += bad
            return control

        def _skip_or_not(self, params: list[Any], finite: bool, step: int) -> None:
            if finite:
                self.skipped_in_a_row = 0
                return
            for p in params:  # optimizers leave a parameter without a gradient as it is (weights and moments)
                p.grad = None
            self.skipped += 1
            self.skipped_in_a_row += 1
            log.warning("step %d: non-finite gradient norm: optimizer step skipped (TRAIN_ON_NAN=skip; %d in a row, "
                        "%d in all)", step, self.skipped_in_a_row, self.skipped)  # fmt: skip

        # ---- decisions: where the run logs, saves, evaluates or ends ----

        def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                        model: Module | None = None, **kwargs: object) -> Any:  # fmt: skip
            if self.diverged_at is not None:
                return self._end(control)
            if self.policy == "skip" and self.skipped_in_a_row >= MAX_SKIPS_IN_A_ROW:
                self._diverged(state.global_step, f"{self.skipped_in_a_row} optimizer steps in a row had a "
                               "non-finite gradient norm (all skipped)")  # fmt: skip
                return self._end(control)
            decides = control.should_log or control.should_evaluate  # a save asks allows_save, inside the save
            if self.policy == "stop" and decides and self._read_gradient_flag(state):
                return self._end(control)
            return control

        def allows_save(self, state: TrainerState, control: TrainerControl, model: Module) -> bool:
            """Asked by AtomicCheckpointTrainer before it writes a checkpoint: False (and the run ends) when a step
            had non-finite gradients or the weights are not finite. Inside the save, so that a step that saves adds
            no host read before it (tests/trainer/test_step_syncs.py)."""
            if self.diverged_at is None and self.policy == "stop":
                self._read_gradient_flag(state)
            if self.diverged_at is None and model is not None:
                finite = all_finite(model.parameters())
                if finite is not None and bool(_agreed(~finite)):
                    self._diverged(state.global_step, "non-finite weights")
            if self.diverged_at is None:
                return True
            self._end(control)
            return False

        def on_train_end(
            self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
        ) -> Any:
            # after the last step, outside every step: before final/ is written (trainer.run.train asks diverged_at)
            if self.diverged_at is None and self.policy == "stop":
                self._read_gradient_flag(state)
            return control

        def _read_gradient_flag(self, state: TrainerState) -> bool:
            """The device counter read on the host (every rank the same): True when a step had non-finite gradients."""
            if self._bad_steps is None:
                return False
            bad, first = _agreed(self._bad_steps, self._first_bad).tolist()
            if bad:
                self._diverged(first or state.global_step, f"non-finite gradient norm ({bad} step(s) so far)")
            return bool(bad)

        def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                   logs: dict[str, Any] | None = None, **kwargs: object) -> Any:  # fmt: skip
            loss = (logs or {}).get("loss")
            if not isinstance(loss, (int, float)):
                return control
            if math.isfinite(loss):
                self.last_finite_loss, self.last_finite_step = float(loss), state.global_step
            elif self.diverged_at is None:
                self._diverged(state.global_step, f"the loss is {loss}")
            return self._end(control) if self.diverged_at is not None else control

        def on_epoch_end(
            self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
        ) -> Any:
            return self._end(control) if self.diverged_at is not None else control

        def _diverged(self, step: int, reason: str) -> None:
            self.diverged_at, self.reason = step, reason

        @staticmethod
        def _end(control: TrainerControl) -> TrainerControl:
            control.should_save = False  # a checkpoint now would hold non-finite weights (or follow skipped steps)
            control.should_evaluate = False
            control.should_training_stop = True
            return control

        # ---- the end of the run ----

        def report(self, lr: float, output_dir: Path, main_process: bool, settings: TrainSettings) -> int:
            """Log what happened and what to do, record it (RECORD, read by any restart); the exit code."""
            if main_process:
                record = {"step": self.diverged_at, "reason": self.reason, "last_finite_loss": self.last_finite_loss,
                          "last_finite_step": self.last_finite_step, "settings": settings_digest(settings),
                          "time": time.time()}  # fmt: skip
                (output_dir / RECORD).write_text(json.dumps(record, allow_nan=False) + "\n")
            last = (f"the last finite loss was {self.last_finite_loss:.4g} at step {self.last_finite_step}"
                    if self.last_finite_loss is not None else "no finite loss was logged")  # fmt: skip
            log.error(
                "training diverged at step %d: %s; %s. No checkpoint was written after it: the newest checkpoint holds "
                "the last finite weights; no final/, nothing pushed. Lower TRAIN_LR (now %g) or the warmup's peak, or "
                "set TRAIN_ON_NAN=skip to skip such steps; exit %d",
                self.diverged_at, self.reason, last, lr, EXIT_DIVERGED,
            )  # fmt: skip
            return EXIT_DIVERGED

    return DivergenceGuard
