"""The training run: `run(cfg) -> exit code`.

Builds the tokenizer, the packed dataset and the model, resumes per TRAIN_RESUME, trains with an
`AtomicCheckpointTrainer` (checkpoints appear only complete), writes metrics.jsonl, stops cleanly on
SIGTERM/SIGINT (exit 128+N, "interrupted" in the log) and saves `final/` (model + tokenizer).
Nothing heavy is imported at module level: the offline environment must be set before transformers loads.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.compat import resuming_from
from trainer.config.methods import ONLINE
from trainer.errors import EXIT_OK
from trainer.logs import setup_logging

if TYPE_CHECKING:
    from trainer.config.resume import Resume
    from trainer.config.run_config import RunConfig
    from trainer.config.run_record import RunRecord
    from trainer.run.signals import GracefulStop

log = logging.getLogger("trainer")

OFFLINE_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")


def set_offline_env() -> None:
    """Everything is local: no hub lookups (unless the user set these variables themselves)."""
    for name in OFFLINE_ENV:
        os.environ.setdefault(name, "1")
    hub_constants = sys.modules.get("huggingface_hub.constants")
    if hub_constants is not None and os.environ["HF_HUB_OFFLINE"] not in ("0", "false", "False"):
        hub_constants.HF_HUB_OFFLINE = True  # already imported (e.g. by config resolution): it read the env early


def set_single_process_dist_env(cfg: RunConfig) -> None:
    """DeepSpeed and FSDP need torch.distributed (DeepSpeed would go looking for MPI; Transformers refuses FSDP
    outside distributed training). A lone `python -m trainer` with ZeRO or FSDP is a world of one: give it the
    env:// variables torchrun would.
    """
    from trainer.config.sharding import needs_process_group

    if not needs_process_group(cfg.settings, cfg.deepspeed) or "WORLD_SIZE" in os.environ:
        return
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for name, value in {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }.items():
        os.environ.setdefault(name, value)


def run(cfg: RunConfig) -> int:
    """Train per the resolved config; the exit code follows docs/architecture.md."""
    set_offline_env()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")  # tokenize in parallel; DataLoader workers never tokenize
    set_single_process_dist_env(cfg)
    setup_logging()
    from trainer.config.resume import decide

    resume = decide(cfg.settings)  # before the heavy work: a TRAIN_RESUME the run cannot continue from exits 2 at once
    from trainer.run.signals import GracefulStop
    from trainer.run.startup import StartupClock

    clock = StartupClock()
    clock.mark("imports_and_config")
    stop = GracefulStop().install()
    try:
        return _run(cfg, stop, resume, clock)
    except OSError as exc:
        from trainer.run.disk_space import DISK_ERRNOS, DiskFull

        if exc.errno not in DISK_ERRNOS:
            raise
        where = Path(exc.filename).parent if exc.filename else Path(cfg.settings.output_dir)
        raise DiskFull(where, exc, f"writing {exc.filename or 'the run outputs'}") from None
    finally:
        stop.restore()


def _agreed(resume: Resume, args: Any) -> Resume:
    """Rank 0's resume decision on every rank (each rank decided alone before torch.distributed was up: one with a
    stale view of a network filesystem could pick another step); every rank logs the agreed checkpoint."""
    from trainer.run.signals import from_rank_0

    agreed = from_rank_0(resume, args.world_size)
    if args.process_index != 0:
        log.warning("resume: rank %d %s (rank 0's choice)", args.process_index,
                    f"continues from {agreed.checkpoint}" if agreed.checkpoint else "starts from scratch")  # fmt: skip
    return agreed


def _training_arguments(cfg: RunConfig) -> Any:
    from trainer.config import build_training_arguments

    return build_training_arguments(cfg)  # Transformers' refusals become a ConfigError (exit 2)


def _callbacks(cfg: RunConfig, model: Any, stop: GracefulStop, clock: Any, learned: Any) -> list[Any]:
    from trainer.machine.peaks import this_gpu_peak_flops
    from trainer.run.checkpoint import steps_from_settings
    from trainer.run.metrics import MetricsCallback, flops_per_token
    from trainer.run.signals import StopOnSignal
    from trainer.run.startup import StartupCallback

    s = cfg.settings
    out = Path(s.output_dir)
    callbacks: list[Any] = [
        StopOnSignal(stop),
        steps_from_settings(),
        StartupCallback(clock, learned, compiled=cfg.decisions.compile.value),
        MetricsCallback(out / "metrics.jsonl", s.seq_len, flops_per_token(model, s.seq_len), this_gpu_peak_flops()),
    ]
    if s.profile:
        from trainer.run.profiling import ProfilerCallback

        callbacks.append(ProfilerCallback(out))
    if s.memory_snapshot:
        from trainer.run.profiling import MemorySnapshotCallback

        callbacks.append(MemorySnapshotCallback(out))
    return [*callbacks, divergence_guard(cfg)]  # last: it may cancel a save another callback asked for


def divergence_guard(cfg: RunConfig) -> Any:
    """TRAIN_ON_NAN's guard; the logged loss only where fp16's scaler skips non-finite steps itself or DeepSpeed
    keeps the gradients (trainer.run.divergence)."""
    from trainer.run.divergence import DivergenceGuard

    loss_only = cfg.decisions.precision.value == "fp16" or bool(cfg.decisions.deepspeed.value)
    return DivergenceGuard(cfg.settings.on_nan, watch_gradients=not loss_only)


def fused_adam_kwargs(args: Any) -> dict[str, Any]:
    """apex FusedAdam (AdamW mode) with every Adam setting of TrainingArguments, TRAIN_ARGS' --adam_* included."""
    return {
        "lr": args.learning_rate,
        "betas": (args.adam_beta1, args.adam_beta2),
        "eps": args.adam_epsilon,
        "weight_decay": args.weight_decay,
        "adam_w_mode": True,
    }


def _optimizer_override(cfg: RunConfig, args: Any) -> dict[str, Any]:
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


def _run(cfg: RunConfig, stop: GracefulStop, resume: Resume, clock: Any) -> int:
    from trainer.config.resume import run_record, set_aside_earlier_run
    from trainer.config.run_record import started, write_start
    from trainer.output_lock import acquire_output_lock
    from trainer.run.divergence import RECORD as DIVERGED_RECORD
    from trainer.run.divergence import DivergenceGuard
    from trainer.run.evaluation import EvalMetricsCallback
    from trainer.run.reshard import batch_record, checkpoint_to_load, continue_on_this_count
    from trainer.tokenizer import tokenizer_for

    s = cfg.settings
    out = Path(s.output_dir)
    if cfg.decisions.compile.value:
        cfg = _prepare_compile(cfg)
    cfg, plan = continue_on_this_count(cfg, resume)  # the effective batch kept on another process count
    args = _training_arguments(cfg)
    if args.should_save:
        acquire_output_lock(out)  # before anything is written: a second run on this folder exits 2
    resume = _agreed(resume, args)
    start = started(cfg)  # the run's record, before anything is learned
    if args.should_save:
        if s.resume == "never" and s.start_over:
            set_aside_earlier_run(out)
        write_start(out, start)  # the record's first write (of two)
    tracker_runs = _prepare_trackers(cfg, args, resume)  # an unreachable tracker exits 2 here, before the heavy work
    clock.mark("libraries")
    inputs = cfg.inputs
    choice = inputs.template()
    tokenizer = tokenizer_for(inputs.tokenizer_folder, choice.text, choice.origin, choice.from_setting)
    if s.method == "sft":
        prepared = _sft_trainer(cfg, args, tokenizer, stop, resume, clock, start)
    elif s.method in ONLINE:  # online RL on TRL's trainers (trainer.run.online)
        prepared = _online_trainer(cfg, args, tokenizer, stop, resume, clock, start)
    else:  # preference tuning on TRL's trainers (trainer.run.preference)
        prepared = _preference_trainer(cfg, args, tokenizer, stop, resume, clock, start)
    if prepared is None:
        return _interrupted(stop, None)
    trainer, record = prepared
    if args.should_save:  # what made this run (trainer.provenance): the libraries it imported are all loaded now
        _record_provenance(cfg, tokenizer)
    trainer.checkpoint_record = run_record(s, cfg.hub, batch_record(plan, args))  # read back by config.resume
    if tracker_runs is not None:
        from trainer.trackers.callbacks import install

        install(trainer, record, s.output_dir, tracker_runs, args.process_index == 0)
    if trainer.eval_dataset is not None:
        EvalMetricsCallback(out / "metrics.jsonl", perplexity=s.method == "sft").install(trainer)
        if s.eval_generate and args.process_index == 0:
            from trainer.run.samples import install_samples

            install_samples(trainer, cfg, tokenizer)
    if s.method in ONLINE and args.process_index == 0:  # the sampled completions with their rewards
        from trainer.run.samples import SAMPLES, CompletionSamplesCallback

        trainer.add_callback(CompletionSamplesCallback(trainer, out / SAMPLES))
    if stop.requested and args.world_size == 1:  # several ranks agree on the stop step inside the loop
        return _interrupted(stop, None)
    with checkpoint_to_load(cfg, plan, resume, args) as checkpoint, resuming_from(checkpoint):
        trainer.train(resume_from_checkpoint=checkpoint)
    guard = next(c for c in trainer.callback_handler.callbacks if isinstance(c, DivergenceGuard))
    if guard.diverged_at is not None:
        return guard.report(args.learning_rate, out, args.should_save, s)
    if stop.requested and trainer.state.global_step < trainer.state.max_steps:
        return _interrupted(stop, trainer.state.global_step)
    if stop.requested:
        log.warning("the stop came after the last step: finishing the run (final/, exit 0) instead")
    trainer.save_final(out / "final", tokenizer)
    if args.should_save:
        (out / DIVERGED_RECORD).unlink(missing_ok=True)  # an earlier attempt's record: these settings finished
    log.info("finished: %d steps; model and tokenizer in %s", trainer.state.global_step, out / "final")
    if s.push_to_hub and args.process_index == 0:
        from trainer.export.publish import push_after_run

        return push_after_run(cfg, out, args.world_size)
    return EXIT_OK


def _sft_trainer(cfg: RunConfig, args: Any, tokenizer: Any, stop: GracefulStop, resume: Resume, clock: Any,
                 start: RunRecord) -> tuple[Any, RunRecord] | None:  # fmt: skip
    """The packed dataset, the model and the atomic Trainer of an SFT run, and the run's record with what it learned
    before its first step; None when a stop came while preparing."""
    from transformers import set_seed

    from trainer.data.cache import Stopped
    from trainer.model.packed_attention import collator_for
    from trainer.run.checkpoint import AtomicCheckpointTrainer
    from trainer.run.disk_space import full_disk_ends_run
    from trainer.run.evaluation import training_data
    from trainer.run.training_model import build_model

    inputs = cfg.inputs
    try:  # local rank 0 prepares the data; the other ranks wait for its cache (trainer.data.cache)
        with full_disk_ends_run(inputs.cache_dir, "writing the tokenized data cache"):
            dataset, eval_dataset = training_data(inputs, tokenizer, should_stop=lambda: stop.requested)
    except Stopped:
        return None
    clock.mark("data")
    set_seed(cfg.settings.seed)  # the same initial weights for the same seed
    model = build_model(cfg, tokenizer)
    clock.mark("model")
    _before_training(cfg, args, model, resume)
    decisions = cfg.decisions
    if decisions.auto_batch.value:
        from trainer.run.batch_search import apply_auto_batch

        decisions = apply_auto_batch(cfg, args, model, len(dataset), resume.checkpoint)
    record = _learned(start, args, decisions, len(dataset), getattr(dataset, "report", None))
    return AtomicCheckpointTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        eval_dataset=eval_dataset,
        data_collator=collator_for(cfg.decisions.attn.value, cfg.decisions.cross_entropy.value == "chunked"),
        processing_class=tokenizer,
        callbacks=_callbacks(cfg, model, stop, clock, _record_writer(record, args)),
        **_optimizer_override(cfg, args),
    ), record


def _preference_trainer(cfg: RunConfig, args: Any, tokenizer: Any, stop: GracefulStop, resume: Resume, clock: Any,
                        start: RunRecord) -> tuple[Any, RunRecord]:  # fmt: skip
    """TRL's trainer for TRAIN_METHOD (trainer.run.preference), with the same callbacks and checkpoints as SFT."""
    from transformers import set_seed

    from trainer.run import preference

    rows = preference.training_rows(cfg, tokenizer)
    clock.mark("data")
    set_seed(cfg.settings.seed)
    model = preference.build_policy(cfg, tokenizer)
    clock.mark("model")
    _before_training(cfg, args, model, resume)
    record = _learned(start, args, cfg.decisions, len(rows[0]))
    callbacks = _callbacks(cfg, model, stop, clock, _record_writer(record, args))
    return preference.build_trainer(cfg, args, tokenizer, model, rows, callbacks), record


def _online_trainer(cfg: RunConfig, args: Any, tokenizer: Any, stop: GracefulStop, resume: Resume, clock: Any,
                    start: RunRecord) -> tuple[Any, RunRecord]:  # fmt: skip
    """TRL's GRPO/RLOO trainer (trainer.run.online), the rewards checked before the model loads."""
    from transformers import set_seed

    from trainer.run import online

    rows = online.training_rows(cfg)
    rewards = online.reward_functions(cfg, rows)
    clock.mark("data")
    set_seed(cfg.settings.seed)
    model = online.build_policy(cfg, tokenizer)
    clock.mark("model")
    _before_training(cfg, args, model, resume)
    record = _learned(start, args, cfg.decisions, len(rows))
    callbacks = _callbacks(cfg, model, stop, clock, _record_writer(record, args))
    return online.build_trainer(cfg, args, tokenizer, model, rows, rewards, callbacks), record


def _before_training(cfg: RunConfig, args: Any, model: Any, resume: Resume) -> None:
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


def _record_provenance(cfg: RunConfig, tokenizer: Any) -> None:
    """provenance.json beside run_config.json: image, libraries, hardware, data fingerprints, template, seed."""
    from trainer.data.chat import template_hash
    from trainer.data.mix import mix_file
    from trainer.provenance import record_run

    s, inputs = cfg.settings, cfg.inputs
    data_files = [*mix_file(s.data), *inputs.data.identity_files(),
                  *(inputs.eval_data.identity_files() if s.eval_data else [])]  # fmt: skip
    online = None
    if s.method in ONLINE:
        from trainer.config.online import reward_files
        from trainer.run.online import generation_provenance

        online = {"reward_files": reward_files(s.reward), "generation": generation_provenance(s.rl_engine)}
    record_run(Path(s.output_dir), data_files, cfg.hub, template_hash(tokenizer), s.seed, online)


def _learned(start: RunRecord, args: Any, decisions: Any, sequences: int, mix: dict[str, Any] | None = None
             ) -> RunRecord:  # fmt: skip
    """The run's record with what it learned before its first step: the batch (`decisions`, searched or not), and
    how the DataLoader splits an epoch (batches_per_epoch) with a mix's requested and achieved share per source."""
    import dataclasses

    from trainer.config.run_record import TrainingData

    counts = TrainingData(**batches_per_epoch(sequences, args, start.settings.seq_len), mix=mix)
    return dataclasses.replace(start, decisions=decisions, training_data=counts)


def _record_writer(record: RunRecord, args: Any) -> Any:
    """What the start-up clock calls once, when the first step is timed (or training ends before one): the record's
    second and last write, with the start-up phases (None: not timed)."""
    import dataclasses

    from trainer.config.run_record import write

    def write_learned(startup: Any) -> None:
        if args.should_save:
            write(record.settings.output_dir, dataclasses.replace(record, startup=startup))

    return write_learned


def _prepare_compile(cfg: RunConfig) -> RunConfig:
    """Regional compilation and the compile caches on the cache volume (trainer.config.speed.compile_environment),
    set before Transformers builds its Accelerator; the run with them in its environment (run_config.json's)."""
    import dataclasses

    from trainer.config.speed import compile_environment

    env = compile_environment(os.environ, cfg.settings.compile_scope)
    os.environ.update(env)
    log.info("torch.compile: %s", cfg.decisions.compile.reason)
    return dataclasses.replace(cfg, env={**cfg.env, **env})


def batches_per_epoch(sequences: int, args: Any, seq_len: int) -> dict[str, Any]:
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


def _prepare_trackers(cfg: RunConfig, args: Any, resume: Resume) -> dict[str, Any] | None:
    """W&B / MLflow environment and reachability (trainer.trackers); None when neither is chosen."""
    chosen = cfg.decisions.report_to.value
    trackers = [t for t in chosen if t in ("wandb", "mlflow")] if isinstance(chosen, list) else []
    if not trackers:
        return None
    from trainer.config.resume import recorded_tracker_runs
    from trainer.trackers.environment import prepare

    recorded = recorded_tracker_runs(resume.checkpoint) if resume.checkpoint else {}
    return prepare(cfg, trackers, resume.checkpoint is not None, recorded, args.process_index == 0)


def _interrupted(stop: GracefulStop, step: int | None) -> int:
    import signal

    name = signal.Signals(stop.signum).name
    if step is None:
        log.warning("interrupted by %s before training started; nothing to save; exit %d", name, stop.exit_code)
    else:
        log.warning("interrupted by %s: checkpoint-%d written; restart to resume; exit %d", name, step, stop.exit_code)
    return stop.exit_code
