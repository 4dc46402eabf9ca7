"""A tracker never costs the run: a tracker callback whose server goes away is logged once and dropped.

`DropOnFailure` is mixed into the W&B and MLflow callbacks (trainer.trackers.callbacks): any exception from one of
their events (MLflow's `Max retries exceeded` when its server went away mid-run or before `end_run`) is logged once,
masked, and the tracker is left out for the rest of the run. Training, checkpoints, final/, the push and the exit
code never depend on it. MLflow's client retries a request for minutes by default; trainer.trackers.environment
shortens that (MLFLOW_HTTP_REQUEST_*, unless the user set them) so an outage stalls the run seconds, once.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from trainer.secrets import mask_value

log = logging.getLogger("trainer")

GUARDED_EVENTS = ("on_train_begin", "on_log", "on_evaluate", "on_save", "on_predict", "on_train_end")


class DropOnFailure:
    """Mixin for a TrainerCallback: its events run until the first failure, which is logged and ends its part."""

    tracker = "tracker"
    dropped = False

    def _guarded(self, event: str, *args: Any, **kwargs: Any) -> Any:
        if self.dropped:
            return None
        try:
            return getattr(super(), event)(*args, **kwargs)
        except Exception as exc:  # whatever the tracker's client raises, the run goes on
            self.dropped = True
            first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            log.warning(
                "%s stopped working during %s (%s: %s); it is left out for the rest of this run: training, "
                "checkpoints and final/ go on, and what it had logged stays on its server",
                self.tracker, event, type(exc).__name__, mask_value(first_line),
            )  # fmt: skip
            self.forget()
            return None

    def forget(self) -> None:
        """Drop the tracker's client state without asking its server anything more."""

    def on_train_begin(self, *args: Any, **kwargs: Any) -> Any:
        return self._guarded("on_train_begin", *args, **kwargs)

    def on_log(self, *args: Any, **kwargs: Any) -> Any:
        return self._guarded("on_log", *args, **kwargs)

    def on_evaluate(self, *args: Any, **kwargs: Any) -> Any:
        return self._guarded("on_evaluate", *args, **kwargs)

    def on_save(self, *args: Any, **kwargs: Any) -> Any:
        return self._guarded("on_save", *args, **kwargs)

    def on_predict(self, *args: Any, **kwargs: Any) -> Any:
        return self._guarded("on_predict", *args, **kwargs)

    def on_train_end(self, *args: Any, **kwargs: Any) -> Any:
        return self._guarded("on_train_end", *args, **kwargs)


def forget_mlflow_run(callback: Any) -> None:
    """MLflow: no end_run later (the callback's __del__ and MLflow's own exit hook would retry the lost server)."""
    callback._auto_end_run = False
    with contextlib.suppress(Exception):  # MLflow's fluent run stack (private): the exit hook ends what it holds
        from mlflow.tracking import fluent

        fluent._active_run_stack.get().clear()
