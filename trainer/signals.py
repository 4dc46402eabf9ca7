"""SIGTERM/SIGINT: finish the current optimizer step, write a checkpoint, stop, exit 128+N.

The handler only records the signal; the `StopOnSignal` callback acts on it at the end of the next
step (after gradient accumulation), asking Trainer to save and stop. A repeated signal is logged and
otherwise ignored, so it cannot abort a save in progress (SIGKILL remains the hard stop, and loses
at most the steps since the last complete checkpoint). With several ranks the flag is reduced across
ranks every step, so all of them stop at the same step even when the signal reaches them at
different times. DataLoader workers are forked after `install()`, so they inherit the same
handler and are not killed by a Ctrl-C sent to the whole process group.
"""

from __future__ import annotations

import logging
import signal
from typing import Any

from transformers import TrainerCallback

from trainer.errors import exit_code_for_signal

log = logging.getLogger("trainer")

HANDLED = (signal.SIGTERM, signal.SIGINT)


class GracefulStop:
    """Remembers the first SIGTERM/SIGINT received."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> GracefulStop:
        for sig in HANDLED:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.signum is None:
            self.signum = signum
            log.warning("%s received: finishing the current step, then writing a checkpoint and stopping", name)
        else:
            log.warning(
                "%s received again: still stopping cleanly (a checkpoint is being written); "
                "SIGKILL stops at once and loses the steps since the last checkpoint",
                name,
            )

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        return exit_code_for_signal(self.signum) if self.signum is not None else 0


def _any_rank_requested(local: bool, world_size: int) -> bool:
    if world_size <= 1:
        return local
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return local
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    flag = torch.tensor([1 if local else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


class StopOnSignal(TrainerCallback):
    """At the end of a step, after a signal: save a checkpoint and stop training."""

    def __init__(self, stop: GracefulStop) -> None:
        self.stop = stop
        self.stopped_at: int | None = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if _any_rank_requested(self.stop.requested, args.world_size):
            if self.stop.signum is None:  # another rank got it first
                self.stop.signum = signal.SIGTERM
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at = state.global_step
        return control
