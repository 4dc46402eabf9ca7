"""Online RL's step, split: the time each optimizer step spends producing its completions, logged per step.

TRL's GRPO/RLOO trainers make a step's completions in `_prepare_inputs`, the hook Transformers' `training_step` calls
with each batch: they generate (Transformers' generate here, or the vLLM server), score them with the rewards, and
compute the log-probs the loss needs, then hand the buffered batch to the training step. The subclass below times
that call, nothing inside it, so it holds for either engine and needs no TRL internals; the rest of the step (forward,
backward, optimizer) is the step time less it. metrics.jsonl carries the mean per optimizer step since the last log
line under GENERATION_KEY (trainer.run.metrics passes keys with a "/" through); `bench`'s rl_split row reads it.
"""

from __future__ import annotations

import functools
import time
from typing import Any

GENERATION_KEY = "time/generation_s"


@functools.cache  # one subclass per base
def timed_generation(base: type) -> type:
    """`base` (TRL's GRPOTrainer or RLOOTrainer) logging GENERATION_KEY with each training log line."""

    class TimedGeneration(base):
        _generation_s = 0.0
        _generation_logged_at: int | None = None  # global_step of the last log line (or where a resumed run began)

        def _prepare_inputs(self, inputs: Any) -> Any:
            if self._generation_logged_at is None:
                self._generation_logged_at = self.state.global_step
            started = time.perf_counter()
            try:
                return super()._prepare_inputs(inputs)
            finally:
                self._generation_s += time.perf_counter() - started

        def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
            if "loss" in logs and self._generation_logged_at is not None:
                steps = self.state.global_step - self._generation_logged_at
                if steps > 0:
                    logs[GENERATION_KEY] = self._generation_s / steps
                self._generation_s, self._generation_logged_at = 0.0, self.state.global_step
            super().log(logs, *args, **kwargs)

    TimedGeneration.__name__ = TimedGeneration.__qualname__ = f"Timed{base.__name__}"
    return TimedGeneration
