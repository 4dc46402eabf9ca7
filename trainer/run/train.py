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
from typing import TYPE_CHECKING, Any, Protocol, cast

from trainer.errors import EXIT_OK
from trainer.library_patches import resuming_from
from trainer.logs import setup_logging
from trainer.machine.threads import DECIDED

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from trainer.config.resume import Resume
    from trainer.config.run_config import RunConfig
    from trainer.run.kit import Arguments, Prepared, Setup
    from trainer.run.signals import GracefulStop
    from trainer.run.startup import StartupClock

log = logging.getLogger("trainer")

OFFLINE_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")


def set_offline_env() -> None:
    """Everything is local: no hub lookups (unless the user set these variables themselves)."""
    for name in OFFLINE_ENV:
        os.environ.setdefault(name, "1")
    if "huggingface_hub.constants" in sys.modules and os.environ["HF_HUB_OFFLINE"] not in ("0", "false", "False"):
        import huggingface_hub.constants as hub_constants  # already imported (e.g. by config resolution)

        hub_constants.HF_HUB_OFFLINE = True  # it read the env early


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
    if os.environ.get("RANK", "0") == "0" and os.environ.get(DECIDED):
        log.info(os.environ[DECIDED])  # the thread decision (trainer/machine/threads.py, set before torch loaded)
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
        from trainer.machine.disk import DISK_ERRNOS
        from trainer.run.disk_space import DiskFull

        if exc.errno not in DISK_ERRNOS:
            raise
        where = Path(exc.filename).parent if exc.filename else Path(cfg.settings.output_dir)
        raise DiskFull(where, exc, f"writing {exc.filename or 'the run outputs'}") from None
    finally:
        stop.restore()


def _agreed(resume: Resume, args: Arguments) -> Resume:
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


def _run(cfg: RunConfig, stop: GracefulStop, resume: Resume, clock: StartupClock) -> int:
    from trainer.config.resume import run_record, set_aside_earlier_run
    from trainer.config.run_record import started, write_start
    from trainer.output_lock import acquire_output_lock
    from trainer.run.divergence import RECORD as DIVERGED_RECORD
    from trainer.run.divergence import DivergenceGuard
    from trainer.run.evaluation import EvalMetricsCallback
    from trainer.run.kit import Setup
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
    prepared = _family(cfg).prepare(Setup(cfg, args, tokenizer, stop, resume, clock, start))
    if prepared is None:
        return _interrupted(stop, None)
    trainer, record = prepared.trainer, prepared.record
    if args.should_save:  # what made this run (trainer.provenance): the libraries it imported are all loaded now
        _record_provenance(cfg, tokenizer, prepared.provenance, prepared.record.decisions.memory.value,
                           prepared.data_files)  # fmt: skip
    trainer.checkpoint_record = run_record(s, cfg.hub, batch_record(plan, args))  # read back by config.resume
    if tracker_runs is not None:
        from trainer.trackers.callbacks import install

        install(trainer, record, s.output_dir, tracker_runs, args.process_index == 0)
    if trainer.eval_dataset is not None:
        EvalMetricsCallback(out / "metrics.jsonl", perplexity=prepared.perplexity).install(trainer)
        if s.eval_generate and args.process_index == 0:
            from trainer.run.samples import install_samples

            install_samples(trainer, cfg, tokenizer)
    for callback in prepared.after_trackers:  # online RL: the sampled completions with their rewards
        trainer.add_callback(callback)
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
    trainer.save_final(out / "final", prepared.processor or tokenizer)
    if args.should_save:
        (out / DIVERGED_RECORD).unlink(missing_ok=True)  # an earlier attempt's record: these settings finished
    log.info("finished: %d steps; model and tokenizer in %s", trainer.state.global_step, out / "final")
    if s.push_to_hub and args.process_index == 0:
        from trainer.export.publish import push_after_run

        return push_after_run(cfg, out, args.world_size)
    return EXIT_OK


class Family(Protocol):
    """A family's module (trainer/methods.py: sft, preference, online), which builds its methods' trainer."""

    def prepare(self, setup: Setup) -> Prepared | None: ...


def _family(cfg: RunConfig) -> Family:
    """trainer.run.sft, trainer.run.preference or trainer.run.online: the module of TRAIN_METHOD's family."""
    import importlib

    from trainer.methods import of

    return cast(Family, importlib.import_module(f"trainer.run.{of(cfg.settings.method).family}"))


def _record_provenance(cfg: RunConfig, tokenizer: PreTrainedTokenizerBase, method: dict[str, Any] | None,
                       memory: dict[str, Any] | None, more: tuple[Path, ...] = ()) -> None:  # fmt: skip
    """provenance.json beside run_config.json: image, libraries, hardware, data fingerprints (`more`: files the
    records name, such as images), template, seed, the memory prediction (`memory`: decisions.memory's value)."""
    from trainer.data.chat import template_hash
    from trainer.data.mix import mix_file
    from trainer.provenance import record_run

    s, inputs = cfg.settings, cfg.inputs
    data_files = [*mix_file(s.data), *inputs.data.identity_files(),
                  *(inputs.eval_data.identity_files() if s.eval_data else []), *more]  # fmt: skip
    record_run(Path(s.output_dir), data_files, cfg.hub, template_hash(tokenizer), s.seed, method, memory)


def _prepare_compile(cfg: RunConfig) -> RunConfig:
    """Regional compilation and the compile caches on the cache volume (trainer.config.speed.compile_environment),
    set before Transformers builds its Accelerator; the run with them in its environment (run_config.json's)."""
    import dataclasses

    from trainer.config.speed import compile_environment

    env = compile_environment(os.environ, cfg.settings.compile_scope)
    os.environ.update(env)
    log.info("torch.compile: %s", cfg.decisions.compile.reason)
    return dataclasses.replace(cfg, env={**cfg.env, **env})


def _prepare_trackers(cfg: RunConfig, args: Arguments, resume: Resume) -> dict[str, Any] | None:
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

    assert stop.signum is not None, "interrupted without a signal"
    name = signal.Signals(stop.signum).name
    if step is None:
        log.warning("interrupted by %s before training started; nothing to save; exit %d", name, stop.exit_code)
    else:
        log.warning("interrupted by %s: checkpoint-%d written; restart to resume; exit %d", name, step, stop.exit_code)
    return stop.exit_code
