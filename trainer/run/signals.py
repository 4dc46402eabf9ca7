"""SIGTERM/SIGINT: finish the current optimizer step, write a checkpoint, stop, exit 128+N.

Who gets the signal. Schedulers rarely signal only the trainer: dumb-init (the image's PID 1), `docker stop`,
`compose stop` and Ctrl-C signal the whole process group, torchrun signals each worker's group, and Slurm's
scancel signals every process of the step. DataLoader workers are in those groups, and PyTorch's worker SIGTERM
handler kills the worker unless its parent sent it; the main process then dies with "DataLoader worker is killed
by signal". So the training DataLoader starts its workers through `ShieldedForkContext`: a worker is born with
SIGTERM/SIGINT blocked and reads them in a thread: a SIGTERM from the parent (the DataLoader shutting its workers
down) ends the worker as before; any other is ignored, and the main process stops the workers itself after the
checkpoint.

The main process. `GracefulStop`'s handler only records the signal; `StopOnSignal` acts on it at the end of a
step (after gradient accumulation), asking Trainer to save and stop. A repeated signal is logged and otherwise
ignored, so it cannot abort a save in progress (SIGKILL remains the hard stop, and loses at most the steps since
the last complete checkpoint).

Several ranks must stop on the same step, although the signal reaches them at different times.
`StopAgreement` all-reduces the signal number over a CPU (gloo) group without blocking: the reduction started at
the end of step N is read at the end of step N+1 (it has long finished by then), and every rank stops at the
first step whose result is non-zero. No device tensor, no host-device sync, no wait on the other ranks per step;
the cost is a stop latency of at most two steps.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.context
import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from trainer.errors import exit_code_for_signal

if TYPE_CHECKING:
    from types import FrameType

    import torch
    from transformers import TrainerControl, TrainerState, TrainingArguments

log = logging.getLogger("trainer")

HANDLED = (signal.SIGTERM, signal.SIGINT)
_REQUESTED: list[int] = []  # the stop signal this process received, for code that cannot finish its step alone
_REQUESTED_AT: list[float] = []  # when it came (time.monotonic())


def requested_signal() -> int | None:
    """The SIGTERM/SIGINT a GracefulStop of this process received (None: none): trainer.run.rewards bounds a reward
    call that would otherwise keep the step, and so the stop, from ever finishing."""
    return _REQUESTED[0] if _REQUESTED else None


def requested_at() -> float | None:
    """When (time.monotonic()) the stop signal of `requested_signal` came; None: none came. Tool calls after it
    share one grace from this moment (trainer.run.tool_calls)."""
    return _REQUESTED_AT[0] if _REQUESTED_AT else None


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

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.signum is None:
            self.signum = signum
            _REQUESTED.append(signum)
            _REQUESTED_AT.append(time.monotonic())
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


# ---- DataLoader workers -------------------------------------------------------------------------------------------


def _serve_worker_signals(parent: int) -> None:
    while True:
        info = signal.sigwaitinfo(set(HANDLED))
        if info.si_signo == signal.SIGTERM and (info.si_pid == parent or os.getppid() != parent):
            os._exit(0)  # the DataLoader ends its worker (what PyTorch's own worker handler does for the parent)


class _ShieldedForkProcess(multiprocessing.context.ForkProcess):
    """A DataLoader worker that ignores SIGTERM/SIGINT unless its parent (the DataLoader) sends SIGTERM.

    The signals are blocked around the fork, so the worker is born with them blocked (no window before it is
    shielded); in the worker a thread reads them with sigwaitinfo, which tells who sent each one."""

    def start(self) -> None:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, set(HANDLED))
        try:
            super().start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    def run(self) -> None:
        parent = os.getppid()
        threading.Thread(target=_serve_worker_signals, args=(parent,), name="trainkit-signals", daemon=True).start()
        super().run()


class ShieldedForkContext(multiprocessing.context.ForkContext):
    """The `fork` start method, with DataLoader workers shielded from scheduler stop signals."""

    Process = _ShieldedForkProcess


def shield_workers(dataloader: Any) -> Any:
    """Start `dataloader`'s workers shielded from stop signals (see the module docstring).

    Accelerate's prepared loaders iterate an inner `base_dataloader`, and `skip_first_batches` (resume) copies the
    outer one's attributes: both get the context. A start method the user chose (spawn, forkserver) is kept."""
    if not hasattr(signal, "sigwaitinfo") or multiprocessing.get_start_method(allow_none=True) not in (None, "fork"):
        return dataloader
    for loader in (dataloader, getattr(dataloader, "base_dataloader", None)):
        if loader is not None and getattr(loader, "num_workers", 0) > 0:
            current = loader.multiprocessing_context
            if current is None or getattr(current, "_name", None) == "fork":
                loader.multiprocessing_context = ShieldedForkContext()
    return dataloader


# ---- agreement across ranks ---------------------------------------------------------------------------------------


_CONTROL_GROUP: list[Any] = []


def control_group(world_size: int) -> Any:
    """This process's CPU (gloo) group of all ranks, for agreements that must not touch the device (None: one
    process). Made by the first call, which every rank makes at the same point of the run."""
    if world_size <= 1:
        return None
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    if not _CONTROL_GROUP:
        _CONTROL_GROUP.append(dist.new_group(backend="gloo"))
    return _CONTROL_GROUP[0]


def from_rank_0(value: Any, world_size: int) -> Any:
    """Rank 0's `value` on every rank (over the control group; one process: `value` itself). Every rank calls it at
    the same point of the run."""
    group = control_group(world_size)
    if group is None:
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


class StopAgreement:
    """The signal every rank agrees to stop for; one process decides alone."""

    def __init__(self, world_size: int) -> None:
        self._flag: torch.Tensor | None = None
        self._pending: Any = None
        self.group = control_group(world_size)
        if self.group is not None:
            import torch

            self._flag = torch.zeros(1, dtype=torch.int64)
            self._host = self._flag.numpy()  # the flag's own memory: read and written without a tensor op

    def poll(self, local_signum: int | None) -> int:
        """At the end of a step: the agreed signal number, or 0 to go on. Ranks call this once per step each."""
        if self.group is None:
            return local_signum or 0
        import torch.distributed as dist

        agreed = 0
        if self._pending is not None:
            self._pending.wait()  # started one step ago: finished long since
            self._pending = None
            agreed = int(self._host[0])
        if not agreed:
            self._host[0] = local_signum or 0
            self._pending = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        return agreed

    def close(self) -> None:
        if self._pending is not None:
            self._pending.wait()
            self._pending = None


class StopOnSignal(TrainerCallback):
    """At the end of a step, once the ranks agree on a signal: save a checkpoint and stop training."""

    def __init__(self, stop: GracefulStop) -> None:
        self.stop = stop
        self.stopped_at: int | None = None
        self.agreement: StopAgreement | None = None

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> Any:
        if self.agreement is None:  # a retry of auto_find_batch_size begins again: keep the group
            self.agreement = StopAgreement(args.world_size)
        return control

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> Any:
        if self.stopped_at is not None:
            return control
        agreement = self.agreement or StopAgreement(1)
        signum = agreement.poll(self.stop.signum)
        if signum:
            if self.stop.signum != signum:  # another rank got it first, or got a different one
                log.warning("%s received by another rank: stopping with it", signal.Signals(signum).name)
                self.stop.signum = signum
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at = state.global_step
        return control

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> Any:
        if self.agreement is not None:
            self.agreement.close()
        return control
