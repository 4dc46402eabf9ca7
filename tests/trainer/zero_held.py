"""A torchrun worker for tests/trainer/test_memory_zero.py: the trainer's own run (`python -m trainer train`, with the
DeepSpeed config it generates for TRAIN_ZERO_STAGE) once per STAGE/PRECISION[/MODEL FOLDER] of $ZERO_HELD_RUNS,
in one process per rank, with one more callback. It wraps the ZeRO optimizer's step and writes what this rank holds
to $ZERO_HELD_DIR/zero<STAGE>-<PRECISION>[-folder]-rank<RANK>.json: the gradients at the end of the backward pass
(ZeRO-1/2, where DeepSpeed clears the parameters' .grad) and just before the step, and after the step the model's
weights (ZeRO-1/2's flat buffers; ZeRO-3's parameter partitions and the small parameters it keeps whole), the fp32
master partitions and the optimizer's state. Bytes are those of the distinct storages (views into one flat buffer
counted once), so DeepSpeed's alignment padding is in them."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

import trainer.run.kit as kit
from trainer.__main__ import main


def storage_bytes(tensors: list[Any]) -> int:
    found = [t for t in tensors if torch.is_tensor(t) and t.numel()]
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in found}.values())


def flat(nested: Any) -> list[Any]:
    """The tensors of a tensor or a list/dict of them, nested (DeepSpeed's per-group containers)."""
    if torch.is_tensor(nested):
        return [nested]
    if isinstance(nested, dict):
        return [t for v in nested.values() for t in flat(v)]
    if isinstance(nested, (list, tuple)):
        return [t for v in nested for t in flat(v)]
    return []


def stage3(zero: Any) -> bool:
    return hasattr(zero, "fp32_partitioned_groups_flat")


def zero_optimizer(optimizer: Any) -> Any:
    """DeepSpeed's ZeRO optimizer under Accelerate's wrapper."""
    while not (stage3(optimizer) or hasattr(optimizer, "single_partition_of_fp32_groups")):
        optimizer = optimizer.optimizer
    return optimizer


def gradients(zero: Any) -> int:
    """The gradients this rank keeps for its step: ZeRO-3's flat buffer of its partitions; ZeRO-1/2's reduced
    gradients (views into the whole tensors that overlap its partition), and any .grad still held beside them."""
    if stage3(zero):
        return storage_bytes(flat(zero.grad_partitions_flat_buffer) + flat(zero.averaged_gradients))
    params = [p for group in zero.bit16_groups for p in group]
    return storage_bytes(flat(zero.averaged_gradients) + [p.grad for p in params])


def held_after_step(zero: Any, model: Any) -> dict[str, int]:
    params = list(model.parameters())
    if stage3(zero):
        partitions = [p.ds_tensor for p in params]
        whole = [p.data for p in params if p.data.numel()]  # persistent (small) parameters stay whole on every rank
        master = storage_bytes(flat(zero.fp32_partitioned_groups_flat))
        found = {"weights": storage_bytes(partitions + whole), "weights_partitions": storage_bytes(partitions),
                 "weights_whole": storage_bytes(whole), "master": master}  # fmt: skip
    else:
        found = {"weights": storage_bytes(flat(zero.bit16_groups_flat)),
                 "master": storage_bytes(flat(zero.single_partition_of_fp32_groups))}  # fmt: skip
    state = [v for entry in zero.optimizer.state.values() for v in entry.values() if torch.is_tensor(v)]
    return {**found, "optimizer_state": storage_bytes(state), "optimizer_groups": len(zero.optimizer.param_groups)}


class HeldBytes(TrainerCallback):
    """Wraps the ZeRO optimizer's step (and ZeRO-1/2's end-of-backward clearing of .grad) to record what it holds."""

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       **kwargs: Any) -> None:  # fmt: skip
        zero = zero_optimizer(optimizer)
        held: dict[str, Any] = {"class": type(zero).__name__}
        real_step = zero.step

        def step(*a: Any, **k: Any) -> Any:
            held["gradients"] = gradients(zero)
            result = real_step(*a, **k)
            held.update(held_after_step(zero, model))
            record(os.environ["ZERO_HELD_RUN"]).write_text(json.dumps(held))
            return result

        zero.step = step
        if not stage3(zero):
            real_clear = zero._clear_param_grad_only

            def clear() -> None:
                params = [p for group in zero.bit16_groups for p in group]
                held["gradients_end_of_backward"] = storage_bytes([p.grad for p in params])
                real_clear()

            zero._clear_param_grad_only = clear


original = kit.callbacks


def with_held_bytes(*args: Any, **kwargs: Any) -> list[Any]:
    return [*original(*args, **kwargs), HeldBytes()]


def run_name(run: str) -> str:
    """zero<STAGE>-<PRECISION>[-folder] for a run STAGE/PRECISION[/MODEL FOLDER]."""
    return "zero" + "-".join(run.split("/")[:2]) + ("-folder" if run.count("/") > 1 else "")


def record(run: str) -> Path:
    return Path(os.environ["ZERO_HELD_DIR"]) / f"{run_name(run)}-rank{os.environ['RANK']}.json"


def run_stages(runs: list[str], output: Path) -> int:
    """One trainer run per STAGE/PRECISION[/MODEL FOLDER] of `runs` (TRAIN_MODEL's model, or that folder's) in this
    process, each in its own output folder; Accelerate's process-wide state is reset between them (the process
    group stays)."""
    from accelerate.state import AcceleratorState, PartialState

    model = os.environ.get("TRAIN_MODEL")
    for run in runs:
        stage, precision, *folder = run.split("/", 2)
        os.environ.update(TRAIN_ZERO_STAGE=stage, TRAIN_PRECISION=precision, ZERO_HELD_RUN=run,
                          TRAIN_OUTPUT_DIR=str(output / run_name(run)))  # fmt: skip
        os.environ.pop("TRAIN_MODEL", None)
        if folder or model:
            os.environ["TRAIN_MODEL"] = folder[0] if folder else str(model)
        started = time.monotonic()
        code = main(["train"])
        if code:
            return code
        held = record(run)
        held.write_text(json.dumps({**json.loads(held.read_text()), "seconds": time.monotonic() - started}))
        AcceleratorState._reset_state(reset_partial_state=True)
        PartialState._reset_state()
    return 0


if __name__ == "__main__":
    kit.callbacks = with_held_bytes  # the run's own callbacks, this one added
    sys.exit(run_stages(os.environ["ZERO_HELD_RUNS"].split(","), Path(os.environ["TRAIN_OUTPUT_DIR"])))
