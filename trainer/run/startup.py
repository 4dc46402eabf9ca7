"""Seconds to the first step: each start-up phase timed, logged in one line and recorded in run_config.json (the
run's record, trainer.config.run_record: its second write, once the first step is timed).

The phases, from the process's own start (as the OS recorded it) to the end of the first optimizer step:
interpreter, imports and configuration; libraries (transformers) and TrainingArguments; data; model build;
trainer set-up (resume, the batch search, the Trainer, its first batch); the first step. With torch.compile the
first step includes the compilation: its time is estimated as the first step's time minus a normal step's (the
median of the next steps), and reported apart. Timing reads host clocks only: no host-device synchronization.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from transformers import TrainerCallback

from trainer.config.run_record import Startup

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState, TrainingArguments

log = logging.getLogger("trainer")
STEPS_AFTER_FIRST = 3  # normal steps timed to estimate the compile time


def process_start_time() -> float:
    """When this process started (seconds since the epoch); now, where the OS does not say."""
    try:
        import psutil

        return psutil.Process().create_time()
    except (ImportError, OSError):
        return time.time()


class StartupClock:
    """Phase name -> seconds, each phase ending where the next `mark` is made."""

    def __init__(self, started: float | None = None) -> None:
        self.started = process_start_time() if started is None else started
        self.last = self.started
        self.phases: dict[str, float] = {}
        self.compile_s: float | None = None

    def mark(self, phase: str) -> None:
        now = time.time()
        self.phases[phase] = round(now - self.last, 3)
        self.last = now

    def record(self) -> Startup:
        return Startup(round(self.last - self.started, 3), dict(self.phases), self.compile_s)

    def summary(self) -> str:
        parts = ", ".join(f"{name.replace('_', ' ')} {seconds:.2f} s" for name, seconds in self.phases.items())
        line = f"startup: {self.last - self.started:.2f} s from process start to the end of the first step ({parts})"
        if self.compile_s is not None:
            line += f"; torch.compile about {self.compile_s:.2f} s of the first step (its time minus a normal step's)"
        return line


class StartupCallback(TrainerCallback):
    """Marks the trainer set-up and the first step; logs the phases once and hands them to `report` once (None when
    training ended before a first step)."""

    def __init__(self, clock: StartupClock, report: Callable[[Startup | None], None], compiled: bool) -> None:
        self.clock = clock
        self.report = report
        self.compiled = compiled
        self.first_step_s: float | None = None
        self.step_started = 0.0
        self.later_steps: list[float] = []
        self.done = False

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        self.clock.mark("trainer_setup")

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        self.step_started = time.time()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        if self.done:
            return
        if self.first_step_s is None:
            self.clock.mark("first_step")
            self.first_step_s = self.clock.phases["first_step"]
            if not self.compiled:
                self.finish(args)
            return
        self.later_steps.append(time.time() - self.step_started)
        if len(self.later_steps) >= STEPS_AFTER_FIRST:
            self.finish(args)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        if self.done:
            return
        if self.first_step_s is not None:
            self.finish(args)
        else:  # no step was trained (a resume at its last step): nothing timed
            self.done = True
            self.report(None)

    def finish(self, args: TrainingArguments) -> None:
        self.done = True
        if self.compiled and self.later_steps and self.first_step_s is not None:
            self.clock.compile_s = round(max(0.0, self.first_step_s - statistics.median(self.later_steps)), 3)
        log.info(self.clock.summary())
        self.report(self.clock.record())
