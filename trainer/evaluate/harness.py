"""lm-eval-harness tasks (`eval --tasks arc_easy,hellaswag [--limit N] [--num-fewshot K]`) on the loaded model,
offline from the datasets `python -m trainer fetch --tasks ...` put in HF_HOME's cache. Tasks of your own are YAML
files in a folder given by --include-path (lm-eval's task format; a `dataset_path: json` task reads local files).

A task lm-eval does not know, or one whose data is not in the cache while HF_HUB_OFFLINE=1, is a ConfigError naming
the task and the fetch command, raised before any task runs."""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from typing import Any

from trainer.errors import ConfigError

log = logging.getLogger("trainer")
PIP = "pip install lm-eval (it is in the images; the version is pinned in images/versions.toml)"


def split_tasks(text: str) -> list[str]:
    tasks = [t.strip() for t in text.split(",") if t.strip()]
    if not tasks:
        raise ConfigError("--tasks: give task names, comma-separated (e.g. arc_easy,hellaswag)")
    return tasks


@functools.lru_cache(maxsize=4)
def _task_manager(include_path: str | None) -> Any:
    """lm-eval's index of its tasks (some 15,000 YAML files, seconds to read): made once per process."""
    try:
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise ConfigError(f"--tasks needs the lm-eval package: {PIP}") from None
    if include_path and not os.path.isdir(include_path):
        raise ConfigError(f"--include-path {include_path}: no such folder (it holds your tasks' YAML files)")
    return TaskManager(include_path=include_path) if include_path else TaskManager()


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() not in ("0", "false", "")


@dataclass
class Tasks:
    """lm-eval tasks whose data is in place, and the TaskManager that found them (indexing its YAML files is slow:
    it is made once)."""

    names: list[str]
    manager: Any

    def __bool__(self) -> bool:
        return bool(self.names)


def load_tasks(tasks: list[str], include_path: str | None, fetching: bool = False) -> Tasks:
    """The tasks, each with its datasets loaded once (from the cache when offline, downloaded by `fetch`)."""
    manager = _task_manager(include_path)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise ConfigError(*(f"lm-eval task {t!r}: unknown to lm-eval (`lm_eval --tasks list` lists them; "
                            "--include-path DIR adds your own YAML tasks)" for t in unknown))  # fmt: skip
    for task in tasks:
        try:
            manager.load([task])
        except Exception as exc:  # datasets' offline and connection errors have no common class
            if fetching or not _offline():
                raise ConfigError(f"lm-eval task {task!r}: its data could not be loaded ({type(exc).__name__}: "
                                  f"{str(exc)[:300]})") from None  # fmt: skip
            raise ConfigError(f"lm-eval task {task!r}: its data is not in the cache ({os.environ.get('HF_HOME', '~')}"
                              "), and HF_HUB_OFFLINE=1; fetch it where the Hub is reachable: python -m trainer fetch "
                              f"--tasks {task}") from None  # fmt: skip
    return Tasks(tasks, manager)


def run_tasks(loaded: Any, tasks: Tasks, limit: float | None, num_fewshot: int | None, batch_size: int
              ) -> dict[str, dict[str, float | None]]:  # fmt: skip
    """{task: {metric: value}} from lm-eval's simple_evaluate on the loaded model (its weights, tokenizer, adapter)
    for the tasks `load_tasks` found (their data from the cache it filled)."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    model = HFLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=batch_size)
    out = simple_evaluate(model=model, tasks=tasks.names, limit=limit, num_fewshot=num_fewshot, log_samples=False,
                          task_manager=tasks.manager)  # fmt: skip
    results: dict[str, dict[str, float | None]] = {}  # each task's metrics, and its samples (None: not reported)
    for task, metrics in (out or {}).get("results", {}).items():
        results[task] = {name.removesuffix(",none"): value for name, value in metrics.items()
                         if isinstance(value, int | float) and not isinstance(value, bool)}  # fmt: skip
        results[task]["samples"] = (out.get("n-samples", {}).get(task) or {}).get("effective")
    return results
