"""TRAIN_AUTO_BATCH: the largest per-device batch that fits, found before training, the same on every rank.

The probe. One real forward and backward pass of the model at a candidate batch (random token ids, TRAIN_SEQ_LEN
long, under the run's autocast and activation checkpointing), with the optimizer's state held aside as one
allocation of its size (AdamW: two fp32 values per trainable parameter; with several ranks, one more for DDP's
gradient buckets). It reports whether the device ran out of memory, and frees everything it allocated.

The search. From TRAIN_BATCH_SIZE it doubles while the probe fits (up to the ceiling: the blocks one rank gets, at
most MAX_BATCH), or halves while it does not; then it bisects between the largest size that fit and the smallest
that did not. The result is the largest batch that fits. Each verdict is agreed by every rank before the next
size is chosen (a MIN all-reduce over the CPU gloo group of the stop agreement): all ranks probe the same sizes
and end on the same batch, and a rank that runs out of memory never leaves the others waiting.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.config.decisions import Decision
    from trainer.config.run_config import RunConfig
    from trainer.config.schema import TrainSettings

log = logging.getLogger("trainer")

MAX_BATCH = 4096
HEADROOM = 0.05  # of the GPU's memory, kept free beyond what the probe uses (allocator fragmentation, workspaces)
Probe = Callable[[int], bool]


@dataclass
class Search:
    """The chosen batch (0: not even 1 fits) and every (size, fits) probed, in order."""

    batch: int = 0
    probes: list[tuple[int, bool]] = field(default_factory=list)

    def reason(self, ceiling: int) -> str:
        tried = ", ".join(f"{size} {'fits' if ok else 'out of memory'}" for size, ok in self.probes)
        bound = " (the ceiling: a larger batch was not tried)" if self.batch == ceiling else ""
        return f"TRAIN_AUTO_BATCH: largest per-device batch that fits{bound}; probed {tried}"


def search_largest(fits: Probe, start: int, ceiling: int) -> Search:
    """The largest size in 1..ceiling for which `fits` holds, assuming that a size that fits means every smaller one
    does; `fits` is called with one size at a time, the same sequence wherever it returns the same verdicts."""
    found = Search()

    def probe(size: int) -> bool:
        ok = fits(size)
        found.probes.append((size, ok))
        return ok

    start = max(1, min(start, ceiling))
    if probe(start):
        good, bad = start, ceiling + 1
        while good < ceiling:
            size = min(good * 2, ceiling)
            if not probe(size):
                bad = size
                break
            good = size
    else:
        good, bad = 0, start
        while bad > 1:
            size = bad // 2
            if probe(size):
                good = size
                break
            bad = size
    while bad - good > 1:
        size = (good + bad) // 2
        if probe(size):
            good = size
        else:
            bad = size
    found.batch = good
    return found


def agreed(fits: Probe, group: Any) -> Probe:
    """`fits` as every rank of `group` sees it: true only where it fit on all of them (None: this process alone)."""
    if group is None:
        return fits

    def every_rank(size: int) -> bool:
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1 if fits(size) else 0], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
        return bool(flag.numpy()[0])

    return every_rank


def optimizer_state_bytes(model: Any, world_size: int) -> int:
    """Bytes the optimizer state (and DDP's gradient buckets) will take on the device once training starts."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable * (8 + (4 if world_size > 1 else 0))


def memory_probe(model: Any, seq_len: int, vocab_size: int, device: Any, precision: str, reserve: int) -> Probe:
    """fits(batch): one forward and backward pass at `batch` on `device` ran without running out of memory."""
    import torch

    from trainer.compat import out_of_memory_error
    from trainer.precision import compute_dtype

    oom = out_of_memory_error()
    dtype = compute_dtype(precision)

    def fits(batch: int) -> bool:
        held = ids = loss = None
        try:
            held = torch.empty(reserve, dtype=torch.uint8, device=device)
            ids = torch.randint(0, vocab_size, (batch, seq_len), device=device)
            mixed = dtype != torch.float32
            autocast = torch.autocast(device.type, dtype=dtype) if mixed else contextlib.nullcontext()
            with autocast:
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            return True
        except oom:
            return False
        finally:
            del held, ids, loss
            model.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()

    return fits


def choose_batch(
    model: Any,
    args: Any,
    settings: TrainSettings,
    precision: str,
    blocks: int,
    group: Any,
    effective: int | None = None,
) -> Decision[int]:
    """The Decision for the per-device batch (at most `effective` when given); `model` is moved to args.device
    (where Trainer would put it)."""
    from trainer.config.decisions import Decision
    from trainer.errors import ConfigError

    ceiling = max(1, min(MAX_BATCH, blocks // max(args.world_size, 1), effective or MAX_BATCH))
    if args.device.type != "cuda":
        reason = "TRAIN_AUTO_BATCH=1 needs a GPU (a CPU has no out-of-memory error to search against); TRAIN_BATCH_SIZE"
        log.warning("auto batch: no GPU, so the batch stays TRAIN_BATCH_SIZE=%d", settings.batch_size)
        return Decision(settings.batch_size, reason)
    if not (getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)):
        model.to(args.device)
    checkpointing = settings.grad_ckpt and not model.is_gradient_checkpointing
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    vocab = model.get_input_embeddings().weight.shape[0]
    import torch

    headroom = int(HEADROOM * torch.cuda.get_device_properties(args.device).total_memory)
    fits = memory_probe(model, settings.seq_len, vocab, args.device, precision,
                        optimizer_state_bytes(model, args.world_size) + headroom)  # fmt: skip
    found = search_largest(agreed(fits, group), settings.batch_size, ceiling)
    if checkpointing:
        model.gradient_checkpointing_disable()  # Trainer switches it on again from TrainingArguments
    if found.batch == 0:
        raise ConfigError(
            f"TRAIN_AUTO_BATCH=1: not even a batch of 1 fits in GPU memory at TRAIN_SEQ_LEN={settings.seq_len}; "
            "lower TRAIN_SEQ_LEN, or use TRAIN_GRAD_CKPT=1, TRAIN_LORA=1 or sharding (TRAIN_FSDP, TRAIN_ZERO_STAGE)"
        )
    log.info("auto batch: %d per device (%s)", found.batch, found.reason(ceiling))
    return Decision(found.batch, found.reason(ceiling))


def split_effective(effective: int, largest: int) -> tuple[int, int]:
    """(micro-batch, accumulation steps) whose product is `effective`, with the largest micro-batch <= `largest`."""
    micro = next(size for size in range(max(1, min(largest, effective)), 0, -1) if effective % size == 0)
    return micro, effective // micro


def apply_auto_batch(cfg: RunConfig, args: Any, model: Any, blocks: int, resume: Path | None) -> None:
    """The TRAIN_AUTO_BATCH search: the batch the ranks agreed on replaces TRAIN_BATCH_SIZE in `args`; when the user
    set TRAIN_BATCH_SIZE or TRAIN_GRAD_ACCUM, gradient accumulation keeps their product (the effective batch). The
    decisions (with the sizes probed) go to cfg.decisions and run_config.json, and the log says the effective batch.
    A resumed run keeps its checkpoint's batch, so the samples it skips are the ones it trained on."""
    import dataclasses

    from trainer.config.decisions import Decision
    from trainer.config.speed import effective_batch_set
    from trainer.run.resume import recorded_batch_size
    from trainer.run.signals import control_group

    s = cfg.settings
    effective = s.batch_size * s.grad_accum if effective_batch_set(s) else None
    previous = recorded_batch_size(resume) if resume else None
    if previous:
        decision = Decision(previous, f"TRAIN_AUTO_BATCH: the batch of the checkpoint resumed from ({resume})")
        log.info("auto batch: %d per device, as in %s", decision.value, resume)
    else:
        precision = cfg.decisions.precision.value
        group = control_group(args.world_size)
        decision = choose_batch(model, args, s, precision, blocks, group, effective)
    micro, accum = split_effective(effective, decision.value) if effective else (decision.value, s.grad_accum)
    if effective:
        why = f"TRAIN_BATCH_SIZE x TRAIN_GRAD_ACCUM = {effective} kept: {micro} x {accum} accumulation steps"
        decision = Decision(micro, f"{decision.reason}; {why}")
        accum_decision = Decision(accum, f"TRAIN_AUTO_BATCH: {why}")
    else:
        accum_decision = Decision(accum, "set by TRAIN_GRAD_ACCUM (TRAIN_BATCH_SIZE not set: the search may change the "
                                         "effective batch)")  # fmt: skip
    log.info("auto batch: effective batch %d sequences per step (%d per device x %d accumulation x %d processes)%s",
             micro * accum * args.world_size, micro, accum, args.world_size,
             "" if effective else "; TRAIN_BATCH_SIZE was not set, so the search chose it")  # fmt: skip
    args.per_device_train_batch_size = micro
    args.gradient_accumulation_steps = accum
    cfg.decisions = dataclasses.replace(cfg.decisions, batch_size=decision, grad_accum=accum_decision)
    if args.should_save:
        cfg.write_run_config(cfg.settings.output_dir)
