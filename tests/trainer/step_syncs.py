"""What one training step asks of the host, counted in a plain Transformers `Trainer` and in trainkit's run.

    python tests/trainer/step_syncs.py FOLDER [--cuda-sync-debug]        (one process)
    torchrun --nproc-per-node 2 tests/trainer/step_syncs.py FOLDER       (gloo on CPU)

Each rank r writes FOLDER/counts.r.json: {"exit_code", "plain": {step: counts}, "trainkit": {step: counts}}.

Both sides train the tiny preset for MAX_STEPS steps with one logging step (the first, as trainkit logs it) and
no save before the end. A step N is counted when step N-1 neither logged nor saved: its window runs from the
end of step N-1 (after N-1's log/save/evaluate) to the end of step N, after every other callback's on_step_end,
so it holds the data fetch, forward, backward, clipping, optimizer, scheduler and every callback of the step.
In that window are counted:
  - host reads of tensor values (`item`, `tolist`, `numpy`, `cpu`, `bool`/`int`/`float`/`index` of a tensor):
    on a GPU each one is a host-device synchronization;
  - collectives called through `torch.distributed`, by group: the default group (the devices' one; DDP's own
    gradient all-reduce runs in C++ and is not seen on either side) and any other group (trainkit's CPU gloo
    group for the stop agreement);
  - with --cuda-sync-debug, the synchronizations CUDA reports (`torch.cuda.set_sync_debug_mode("warn")`), and
    trainkit's own callbacks run with the mode at "error", so one synchronization in them fails the run.
The plain side is what a user writes: Transformers' defaults plus the run's batch, steps and logging.
The trainkit side is `trainer.run.train.run(cfg)` itself, with the counting callback appended to its callbacks.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from tests.helpers import write_corpus

MAX_STEPS, SEQ, BATCH = 8, 32, 2
LOG_STEPS = 100  # past the run: only logging_first_step logs
READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__")
COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast", "broadcast_object_list",
    "reduce", "reduce_scatter_tensor", "gather", "scatter", "barrier", "all_to_all_single",
)  # fmt: skip


class Counts:
    """Counters that count only while a window is open."""

    def __init__(self) -> None:
        self.open = False
        self.current: dict[str, Any] = {}

    def add(self, key: str) -> None:
        if self.open:
            self.current[key] = self.current.get(key, 0) + 1


COUNTS = Counts()


def _spy(owner: Any, name: str, key: str) -> None:
    original = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        COUNTS.add(key)
        return original(*args, **kwargs)

    setattr(owner, name, counted)


def install_spies() -> None:
    """Wrap (never replace) the calls that read tensor values and the torch.distributed collectives."""
    import torch.distributed as dist

    for name in READS:
        _spy(torch.Tensor, name, "read")

    def group_key(args: tuple, kwargs: dict) -> str:
        group = kwargs.get("group")
        return "collective:default" if group is None or group is dist.group.WORLD else "collective:other"

    for name in COLLECTIVES:
        original = getattr(dist, name)

        def counted(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            COUNTS.add(group_key(args, kwargs))
            return _original(*args, **kwargs)

        setattr(dist, name, counted)


def step_window_callback(log_steps: int, sync_debug: bool, results: dict[int, dict[str, Any]]) -> Any:
    from transformers import TrainerCallback

    class StepWindows(TrainerCallback):
        """Last callback: closes step N's window at its on_step_end, opens N+1's when N neither logs nor saves."""

        def __init__(self) -> None:
            self.warnings_cm: Any = None
            self.syncs: list[str] = []

        def record(self, message: Any, category: Any, filename: str, lineno: int, *rest: Any) -> None:
            if "synchronizing" in str(message):
                self.syncs.append(call_site())

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            step = state.global_step
            if COUNTS.open:
                COUNTS.open = False
                if sync_debug:
                    torch.cuda.set_sync_debug_mode("default")
                    self.warnings_cm.__exit__(None, None, None)
                    COUNTS.current["cuda_sync"] = len(self.syncs)
                    COUNTS.current["sync_sites"] = dict(Counter(self.syncs))  # who called each synchronization
                results[step] = dict(COUNTS.current)
            logs = step % log_steps == 0 or (step == 1 and args.logging_first_step)
            if logs or control.should_log or control.should_save or step >= state.max_steps:
                return
            COUNTS.current = {}
            if sync_debug:
                self.warnings_cm = warnings.catch_warnings()
                self.warnings_cm.__enter__()
                self.syncs = []
                warnings.simplefilter("always")
                warnings.showwarning = self.record
                torch.cuda.set_sync_debug_mode("warn")
            COUNTS.open = True

    return StepWindows()


def call_site(depth: int = 4) -> str:
    """The innermost Python frames that led to a warning, as 'file:line < caller:line < ...' (this file's and the
    warnings machinery's own frames left out)."""
    frames = [f for f in traceback.extract_stack() if Path(f.filename).name not in ("warnings.py", "step_syncs.py")]
    return " < ".join(f"{Path(f.filename).parent.name}/{Path(f.filename).name}:{f.lineno}"
                      for f in reversed(frames[-depth:]))


def sync_errors_around(callbacks: list[Any]) -> list[Any]:
    """trainkit's callbacks between two gates that raise CUDA's sync debug level to "error" inside open windows."""
    from transformers import TrainerCallback

    class Gate(TrainerCallback):
        def __init__(self, mode: str) -> None:
            self.mode = mode

        def _set(self) -> None:
            if COUNTS.open:
                torch.cuda.set_sync_debug_mode(self.mode)

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self._set()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            self._set()

    return [Gate("error"), *callbacks, Gate("warn")]


def plain_run(out: Path, cfg: Any, sync_debug: bool) -> dict[int, dict[str, Any]]:
    """A user's script: Transformers' defaults, with trainkit's batch, steps, logging, workers, precision and
    attention (precision and attention decide which kernels run, e.g. fp16's loss scaler)."""
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments, default_data_collator, set_seed

    from trainer.model.build import preset_config
    from trainer.tokenizer import byte_level_tokenizer

    tok = byte_level_tokenizer()
    set_seed(7)
    precision = cfg.decisions.precision.value
    model = AutoModelForCausalLM.from_config(
        preset_config("tiny", len(tok), SEQ, tok), attn_implementation=cfg.decisions.attn.value
    )
    blocks = torch.randint(0, len(tok), (64, SEQ))
    data = [{"input_ids": b, "labels": b} for b in blocks]
    args = TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=BATCH, max_steps=MAX_STEPS, logging_steps=LOG_STEPS,
        logging_first_step=True, save_steps=100, report_to="none", use_cpu=not sync_debug,
        dataloader_num_workers=cfg.settings.num_workers, seed=7, bf16=precision == "bf16", fp16=precision == "fp16",
    )  # fmt: skip
    results: dict[int, dict[str, Any]] = {}
    callback = step_window_callback(LOG_STEPS, sync_debug, results)
    Trainer(
        model=model, args=args, train_dataset=data, data_collator=default_data_collator, callbacks=[callback]
    ).train()
    return results


def trainkit_config(out: Path, data: Path) -> Any:
    """The resolved configuration of trainkit's run: the user's defaults but for the short run's size."""
    for key in [k for k in os.environ if k.startswith("TRAIN_")]:
        del os.environ[key]
    os.environ.update(
        TRAIN_OUTPUT_DIR=str(out), TRAIN_DATA=str(data), TRAIN_SEQ_LEN=str(SEQ), TRAIN_BATCH_SIZE=str(BATCH),
        TRAIN_MAX_STEPS=str(MAX_STEPS), TRAIN_LOG_STEPS=str(LOG_STEPS), TRAIN_SAVE_STEPS="100", TRAIN_SEED="7",
    )  # fmt: skip
    from trainer import config

    config.apply_process_defaults()
    return config.resolve(config.load_inputs())


def trainkit_run(cfg: Any, sync_debug: bool) -> tuple[int, dict[int, dict[str, Any]]]:
    """`trainer.run.train.run(cfg)` with the probe's callbacks; its exit code and counts."""
    from trainer.run import kit, train

    results: dict[int, dict[str, Any]] = {}
    own_callbacks = kit.callbacks

    def with_probe(*args: Any) -> list[Any]:
        callbacks = own_callbacks(*args)
        if sync_debug:
            callbacks = sync_errors_around(callbacks)
        return [*callbacks, step_window_callback(LOG_STEPS, sync_debug, results)]

    kit.callbacks = with_probe
    try:
        code = train.run(cfg)
    finally:
        kit.callbacks = own_callbacks
    return code, results


def main() -> None:
    """--side trainkit|plain runs one side only: a process's one-time CUDA set-up (handles, lazy modules) then
    falls in that side's own steps, as it does for a user, instead of only in whichever side runs first."""
    folder = Path(sys.argv[1])
    sync_debug = "--cuda-sync-debug" in sys.argv
    side = sys.argv[sys.argv.index("--side") + 1] if "--side" in sys.argv else "both"
    rank = int(os.environ.get("RANK", "0"))
    install_spies()
    data = folder / "data.txt"
    if rank == 0:
        write_corpus(data)
    else:
        while not data.is_file():  # rank 0 writes it; the trainer's own barriers start after
            time.sleep(0.05)
    cfg = trainkit_config(folder / "trainkit", data)
    out: dict[str, Any] = {"exit_code": 0}
    if side in ("both", "trainkit"):
        out["exit_code"], out["trainkit"] = trainkit_run(cfg, sync_debug)
    if side in ("both", "plain"):
        out["plain"] = plain_run(folder / "plain", cfg, sync_debug)
    (folder / f"counts.{rank}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main()
