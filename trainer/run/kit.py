"""What every method's trainer is built on (trainer.run.sft, trainer.run.preference, trainer.run.online): the
model made after the data, from the seed, the output folder made ready for it; the callbacks (stops, metrics,
start-up clock, profiler, divergence guard); the optimizer Transformers does not build itself; the run's record
with what it learned before its first step, and its second write.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from torch.nn import Module
    from transformers import PreTrainedTokenizerBase, Trainer

    from trainer.config.decision import Decisions
    from trainer.config.resume import Resume
    from trainer.config.run_config import RunConfig
    from trainer.config.run_record import RunRecord, Startup
    from trainer.run.divergence import DivergenceGuard
    from trainer.run.router_metrics import RouterMetrics
    from trainer.run.signals import GracefulStop
    from trainer.run.startup import StartupClock

log = logging.getLogger("trainer")
M = TypeVar("M")


class Arguments(Protocol):
    """What trainkit reads of the run's TrainingArguments (or the TRL config that extends them)."""

    world_size: int
    process_index: int
    should_save: bool
    per_device_train_batch_size: int
    dataloader_drop_last: bool
    learning_rate: float
    adam_beta1: float
    adam_beta2: float
    adam_epsilon: float
    weight_decay: float


@dataclasses.dataclass(frozen=True)
class Setup:
    """What a method's trainer is built from: the run's configuration and arguments, its tokenizer, the stop
    signal, the resume decision, the start-up clock and the run's record as first written."""

    cfg: RunConfig
    args: Any  # TrainingArguments or the method's TRL config (Any to mypy; Arguments: what trainkit reads of it)
    tokenizer: PreTrainedTokenizerBase
    stop: GracefulStop
    resume: Resume
    clock: StartupClock
    start: RunRecord

    def model(self, build: Callable[[], M]) -> M:
        """The data is ready: the model `build` makes from TRAIN_SEED (the same initial weights for the same seed),
        and the output folder made ready for it."""
        from transformers import set_seed

        self.clock.mark("data")
        set_seed(self.cfg.settings.seed)
        model = build()
        self.clock.mark("model")
        before_training(self.cfg, self.args, model, self.resume)
        return model

    def callbacks(self, model: Module, record: RunRecord) -> list[Any]:
        """Every method's callbacks, the record's second write at the first timed step included."""
        return callbacks(self.cfg, model, self.stop, self.clock, record_writer(record, self.args),
                         record.decisions.memory.value)


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A method's trainer, ready for `train`, and what the run does around it."""

    trainer: Trainer
    record: RunRecord  # the run's record with what it learned before its first step
    perplexity: bool = False  # the eval loss is a token loss (SFT): perplexity is logged beside it
    after_trackers: tuple[Any, ...] = ()  # callbacks added once the trackers' own are in place
    provenance: dict[str, Any] | None = None  # the method's part of provenance.json (online RL's rewards, generation)
    processor: Any = None  # what final/ saves beside the model when not the tokenizer (a vision model's processor)
    data_files: tuple[Path, ...] = ()  # input files beside TRAIN_DATA's that provenance.json hashes (images)


def callbacks(cfg: RunConfig, model: Module, stop: GracefulStop, clock: StartupClock,
              write_record: Callable[[Startup | None], None], memory: dict[str, Any] | None = None) -> list[Any]:
    """The run's callbacks; `memory`: the memory prediction the run's record holds (trainer.memory.fit), whose
    allocator share metrics.jsonl logs beside the measured peak on a GPU."""
    from trainer.machine.peaks import this_gpu_peak_flops
    from trainer.run.checkpoint import steps_from_settings
    from trainer.run.metrics import MetricsCallback, flops_per_token
    from trainer.run.signals import StopOnSignal
    from trainer.run.startup import StartupCallback

    s = cfg.settings
    out = Path(s.output_dir)
    router = router_metrics(cfg, model)
    found: list[Any] = [
        StopOnSignal(stop),
        steps_from_settings(),
        StartupCallback(clock, write_record, compiled=cfg.decisions.compile.value),
        *([router] if router is not None else []),
        MetricsCallback(out / "metrics.jsonl", s.seq_len, flops_per_token(model, s.seq_len), this_gpu_peak_flops(),
                        memory["predicted_allocated_bytes"] if cfg.hardware.is_gpu and memory else None, router),
    ]
    if s.profile:
        from trainer.run.profiling import ProfilerCallback

        found.append(ProfilerCallback(out))
    if s.memory_snapshot:
        from trainer.run.profiling import MemorySnapshotCallback

        found.append(MemorySnapshotCallback(out))
    return [*found, divergence_guard(cfg)]  # last: it may cancel a save another callback asked for


def router_metrics(cfg: RunConfig, model: Module) -> RouterMetrics | None:
    """A mixture of experts' router health per logging step (trainer.run.router_metrics), its load-balancing loss
    as decided (trainer.config.moe); None for a dense model."""
    from trainer.config.moe import moe_of
    from trainer.run.router_metrics import RouterMetrics

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    moe = moe_of(base.config)
    if moe is None:
        return None
    coefficient = cfg.decisions.moe_aux_loss
    return RouterMetrics(model, moe, coefficient.value, coefficient.reason)


def divergence_guard(cfg: RunConfig) -> DivergenceGuard:
    """TRAIN_ON_NAN's guard; the logged loss only where fp16's scaler skips non-finite steps itself or DeepSpeed
    keeps the gradients (trainer.run.divergence)."""
    from trainer.config.precision import scales_loss
    from trainer.run.divergence import DivergenceGuard

    loss_only = scales_loss(cfg.decisions.precision.value) or bool(cfg.decisions.deepspeed.value)
    return DivergenceGuard(cfg.settings.on_nan, watch_gradients=not loss_only)


def fused_adam_kwargs(args: Arguments) -> dict[str, Any]:
    """apex FusedAdam (AdamW mode) with every Adam setting of TrainingArguments, TRAIN_ARGS' --adam_* included."""
    return {
        "lr": args.learning_rate,
        "betas": (args.adam_beta1, args.adam_beta2),
        "eps": args.adam_epsilon,
        "weight_decay": args.weight_decay,
        "adam_w_mode": True,
    }


def optimizer_override(cfg: RunConfig, args: Arguments) -> dict[str, Any]:
    """Trainer kwargs for an optimizer Transformers does not build itself; logs the optimizer that really runs."""
    from trainer.transformers_names import APEX_FUSED

    chosen = cfg.decisions.optim
    if chosen.value == "deepspeed":
        log.info("optimizer: DeepSpeed's own (%s); TRAIN_OPTIM=%s is not used", chosen.reason, cfg.settings.optim)
        return {}
    if chosen.value != APEX_FUSED:
        log.info("optimizer: %s", chosen.value)
        return {}
    from apex.optimizers import FusedAdam

    log.info("optimizer: NVIDIA apex FusedAdam (AdamW mode)")
    return {"optimizer_cls_and_kwargs": (FusedAdam, fused_adam_kwargs(args))}


def before_training(cfg: RunConfig, args: Arguments, model: Module, resume: Resume) -> None:
    from trainer.run.checkpoint import remove_stale_temps
    from trainer.run.disk_space import warn_if_too_small
    from trainer.run.metrics import truncate_after

    out = Path(cfg.settings.output_dir)
    if args.should_save:
        warn_if_too_small(out, model)
        remove_stale_temps(out)
    log.info("resume: %s", resume.reason)
    if resume.checkpoint and args.should_save:
        truncate_after(out / "metrics.jsonl", resume.step)


def learned(start: RunRecord, args: Arguments, decisions: Decisions, sequences: int, model: Module,
            mix: dict[str, Any] | None = None) -> RunRecord:  # fmt: skip
    """The run's record with what it learned before its first step: the batch (`decisions`, searched or not), how
    the DataLoader splits an epoch (batches_per_epoch) with a mix's requested and achieved share per source, and
    what the model is made of (its component table, logged here: before step 0)."""
    from trainer.config.run_record import TrainingData
    from trainer.model.components import log_components

    counts = TrainingData(**batches_per_epoch(sequences, args, start.settings.seq_len), mix=mix)
    return dataclasses.replace(start, decisions=decisions, training_data=counts,
                               components=tuple(log_components(model)))  # fmt: skip


def record_writer(record: RunRecord, args: Arguments) -> Callable[[Startup | None], None]:
    """What the start-up clock calls once, when the first step is timed (or training ends before one): the record's
    second and last write, with the start-up phases (None: not timed)."""
    from trainer.config.run_record import write

    def write_learned(startup: Startup | None) -> None:
        if args.should_save:
            write(record.settings.output_dir, dataclasses.replace(record, startup=startup))

    return write_learned


def batches_per_epoch(sequences: int, args: Arguments, seq_len: int) -> dict[str, Any]:
    """How the training DataLoader splits an epoch: full batches, and the partial last batch a compiled run leaves
    out (a different random one each epoch). With fewer sequences than one batch there is one shape only: the
    batch is kept (drop_last turned off)."""
    batch = args.per_device_train_batch_size * max(1, args.world_size)
    if sequences < batch:
        args.dataloader_drop_last = False
    partial = sequences % batch if args.dataloader_drop_last else 0
    record = {"sequences": sequences, "global_batch": batch, "left_out_per_epoch": partial,
              "left_out_tokens_per_epoch": partial * seq_len}  # fmt: skip
    if partial:
        log.warning(
            "data: each epoch leaves out %d of %d sequences (%d tokens), its partial last batch: a compiled model "
            "would recompile for that shape (a different random %d each epoch; TRAIN_BATCH_SIZE dividing %d "
            "leaves out none)", partial, sequences, partial * seq_len, partial, sequences,
        )  # fmt: skip
    return record
