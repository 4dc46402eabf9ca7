"""TRAIN_PROFILE (torch.profiler traces for TensorBoard, a text summary) and TRAIN_MEMORY_SNAPSHOT (CUDA memory)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

if TYPE_CHECKING:
    from torch.profiler import profile
    from transformers import TrainerControl, TrainerState, TrainingArguments

log = logging.getLogger("trainer")

# Profiler schedule: skip 1 step, warm up 1, record 3, once.
PROFILE_WAIT, PROFILE_WARMUP, PROFILE_ACTIVE = 1, 1, 3
SNAPSHOT_STEPS = 5  # record the allocator history of the first steps (enough to show the steady state)
SNAPSHOT_MAX_ENTRIES = 100_000


class ProfilerCallback(TrainerCallback):
    """Runs torch.profiler around the first steps; traces go to OUTPUT_DIR/profile (TensorBoard plugin format)."""

    def __init__(self, output_dir: Path) -> None:
        self.trace_dir = output_dir / "profile"
        self.profiler: profile | None = None

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

        on_gpu = torch.cuda.is_available()
        activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if on_gpu else [ProfilerActivity.CPU]
        worker = f"rank{args.process_index}"
        write_trace = tensorboard_trace_handler(str(self.trace_dir), worker_name=worker)

        def on_trace_ready(prof: profile) -> None:
            write_trace(prof)
            write_summary(prof, self.trace_dir / f"summary-{worker}.txt", on_gpu=on_gpu)

        self.profiler = profile(
            activities=activities,
            schedule=schedule(wait=PROFILE_WAIT, warmup=PROFILE_WARMUP, active=PROFILE_ACTIVE, repeat=1),
            on_trace_ready=on_trace_ready,
            record_shapes=True,
            profile_memory=True,
            with_stack=False,
        )
        self.profiler.start()
        log.info(
            "profile: recording steps %d-%d to %s (tensorboard --logdir %s)",
            PROFILE_WAIT + PROFILE_WARMUP + 1,
            PROFILE_WAIT + PROFILE_WARMUP + PROFILE_ACTIVE,
            self.trace_dir,
            self.trace_dir,
        )

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        if self.profiler is not None:
            self.profiler.step()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        if self.profiler is not None:
            self.profiler.stop()
            self.profiler = None


def write_summary(prof: profile, path: Path, on_gpu: bool) -> None:
    """Where the recorded steps spent their time, as a text table (no TensorBoard needed): the operators with
    the most self time on the GPU (on a CPU run, on the CPU)."""
    averages = prof.key_averages()
    # torch >= 2.4 names the column "device"; older releases only know "cuda".
    keys = ("self_device_time_total", "self_cuda_time_total") if on_gpu else ("self_cpu_time_total",)
    for key in keys:
        try:
            table = averages.table(sort_by=key, row_limit=30, max_name_column_width=70)
            break
        except (AttributeError, KeyError, ValueError):
            continue
    else:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{PROFILE_ACTIVE} steps, sorted by {key}\n{table}\n")
    write_self_times(averages, path.with_suffix(".json"), key)
    log.info("profile: the operators that took the most time are in %s", path)


def write_self_times(averages: Any, path: Path, key: str) -> None:
    """Each kernel's (on a CPU, operator's) self time over the recorded steps, in microseconds per step, as JSON
    ({"steps", "time", "self_us": {name: us}}): for tools that group them (benchmarks/gpu_run.py's profile part)."""
    import json

    from torch.autograd import DeviceType

    on_device = key != "self_cpu_time_total"  # there, the kernels alone (an operator's row repeats its kernels' time)
    times = {event.key: getattr(event, key, 0) / PROFILE_ACTIVE for event in averages
             if not on_device or getattr(event, "device_type", None) != DeviceType.CPU}  # fmt: skip
    record = {"steps": PROFILE_ACTIVE, "time": key, "self_us": {k: v for k, v in times.items() if v > 0}}
    path.write_text(json.dumps(record, indent=1, sort_keys=True))


class MemorySnapshotCallback(TrainerCallback):
    """Records CUDA allocator history for the first steps and dumps OUTPUT_DIR/memory_snapshot.pickle."""

    def __init__(self, output_dir: Path) -> None:
        self.path = output_dir / "memory_snapshot.pickle"
        self.recording = False

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        import torch

        if not torch.cuda.is_available():
            log.warning("memory snapshot: TRAIN_MEMORY_SNAPSHOT is CUDA-only; no GPU here, so it is skipped")
            return
        torch.cuda.memory._record_memory_history(max_entries=SNAPSHOT_MAX_ENTRIES)
        self.recording = True
        self._start_step = state.global_step

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        if self.recording and state.global_step - self._start_step >= SNAPSHOT_STEPS:
            self._dump(args)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        if self.recording:
            self._dump(args)

    def _dump(self, args: TrainingArguments) -> None:
        import torch

        path = (
            self.path
            if args.process_index == 0
            else self.path.with_name(f"memory_snapshot.rank{args.process_index}.pickle")
        )
        torch.cuda.memory._dump_snapshot(str(path))
        torch.cuda.memory._record_memory_history(enabled=None)
        self.recording = False
        log.info("memory snapshot: wrote %s (open it at https://pytorch.org/memory_viz)", path)
