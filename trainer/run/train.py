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
from typing import Any

from trainer.compat import resuming_from
from trainer.errors import EXIT_OK

log = logging.getLogger("trainer")

OFFLINE_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")


def set_offline_env() -> None:
    """Everything is local: no hub lookups (unless the user set these variables themselves)."""
    for name in OFFLINE_ENV:
        os.environ.setdefault(name, "1")
    hub_constants = sys.modules.get("huggingface_hub.constants")
    if hub_constants is not None and os.environ["HF_HUB_OFFLINE"] not in ("0", "false", "False"):
        hub_constants.HF_HUB_OFFLINE = True  # already imported (e.g. by config resolution): it read the env early


def _rank_info() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def set_single_process_dist_env(cfg: Any) -> None:
    """DeepSpeed and FSDP need torch.distributed (DeepSpeed would go looking for MPI; Transformers refuses FSDP
    outside distributed training). A lone `python -m trainer` with ZeRO or FSDP is a world of one: give it the
    env:// variables torchrun would.
    """
    sharded = bool(cfg.deepspeed) or cfg.settings.fsdp != "none"
    if not sharded or "WORLD_SIZE" in os.environ:
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


def setup_logging() -> None:
    """The `trainer` logger on stderr; with several ranks, each line says which rank speaks and only rank 0 informs."""
    rank, world = _rank_info()
    prefix = f"[rank {rank}/{world}] " if world > 1 else ""
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
        log.propagate = False
    log.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    if world > 1 and rank == 0:
        log.info(
            "%d processes; rank 0 writes metrics, checkpoints and these logs (other ranks log warnings only)", world
        )


def run(cfg: Any) -> int:
    """Train per the resolved config; the exit code follows docs/architecture.md."""
    set_offline_env()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")  # tokenize in parallel; DataLoader workers never tokenize
    set_single_process_dist_env(cfg)
    setup_logging()
    if cfg.settings.resume not in ("auto", "never"):
        from trainer.run.checkpoint import validate_resume_path

        validate_resume_path(cfg.settings.resume)  # before the heavy work: a user mistake exits 2 at once
    from trainer.run.signals import GracefulStop
    from trainer.run.startup import StartupClock

    clock = StartupClock()
    clock.mark("imports_and_config")
    stop = GracefulStop().install()
    try:
        return _run(cfg, stop, clock)
    finally:
        stop.restore()


def _training_arguments(cfg: Any) -> Any:
    from trainer.config import build_training_arguments

    return build_training_arguments(cfg)  # Transformers' refusals become a ConfigError (exit 2)


def _resume_from(settings: Any, args: Any) -> str | None:
    """The checkpoint to resume from per TRAIN_RESUME; also clears leftovers of a killed save."""
    from trainer.run.checkpoint import newest_complete_checkpoint, remove_stale_temps, validate_resume_path

    mode = settings.resume
    if args.should_save:
        remove_stale_temps(settings.output_dir)
    if mode == "never":
        log.info("resume: TRAIN_RESUME=never, starting from scratch")
        return None
    if mode == "auto":
        found = newest_complete_checkpoint(settings.output_dir)
        if found is None:
            log.info("resume: no complete checkpoint in %s, starting from scratch", settings.output_dir)
            return None
        log.info("resume: continuing from %s (newest complete checkpoint)", found)
        return str(found)
    folder = validate_resume_path(mode)
    log.info("resume: continuing from %s (TRAIN_RESUME)", folder)
    return str(folder)


def _callbacks(cfg: Any, model: Any, stop: Any, clock: Any) -> list[Any]:
    from trainer.run.metrics import MetricsCallback, flops_per_token, peak_flops
    from trainer.run.signals import StopOnSignal
    from trainer.run.startup import StartupCallback

    s = cfg.settings
    out = Path(s.output_dir)
    callbacks: list[Any] = [
        StopOnSignal(stop),
        StartupCallback(clock, cfg, compiled=cfg.decisions.compile.value),
        MetricsCallback(
            out / "metrics.jsonl", s.seq_len, flops_per_token(model, s.seq_len), _gpu_peak_flops(peak_flops)
        ),
    ]
    if s.profile:
        from trainer.run.profiling import ProfilerCallback

        callbacks.append(ProfilerCallback(out))
    if s.memory_snapshot:
        from trainer.run.profiling import MemorySnapshotCallback

        callbacks.append(MemorySnapshotCallback(out))
    return callbacks


def _gpu_peak_flops(lookup: Any) -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    peak = lookup(name)
    if peak is None:
        log.info("metrics: no peak FLOPs known for %s, so mfu is null", name)
    return peak


def fused_adam_kwargs(args: Any) -> dict[str, Any]:
    """apex FusedAdam (AdamW mode) with every Adam setting of TrainingArguments, TRAIN_ARGS' --adam_* included."""
    return {
        "lr": args.learning_rate,
        "betas": (args.adam_beta1, args.adam_beta2),
        "eps": args.adam_epsilon,
        "weight_decay": args.weight_decay,
        "adam_w_mode": True,
    }


def _optimizer_override(cfg: Any, args: Any) -> dict[str, Any]:
    """Trainer kwargs for an optimizer Transformers does not build itself; logs the optimizer that really runs."""
    from trainer.config.train_args import APEX_FUSED

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


def _run(cfg: Any, stop: Any, clock: Any) -> int:
    from transformers import default_data_collator, set_seed

    from trainer.data.cache import Stopped
    from trainer.data.dataset import build_dataset
    from trainer.run.checkpoint import AtomicCheckpointTrainer
    from trainer.run.evaluation import EvalMetricsCallback, split_datasets
    from trainer.run.metrics import truncate_after
    from trainer.run.models import build_model
    from trainer.tokenizer import tokenizer_for

    s = cfg.settings
    out = Path(s.output_dir)
    args = _training_arguments(cfg)
    if args.should_save:
        out.mkdir(parents=True, exist_ok=True)
        cfg.write_run_config(out)
    clock.mark("libraries")
    tokenizer = tokenizer_for(s)
    try:  # local rank 0 prepares the data; the other ranks wait for its cache (trainer.data.cache)
        dataset = build_dataset(s, tokenizer, should_stop=lambda: stop.requested)
        dataset, eval_dataset = split_datasets(s, tokenizer, dataset, should_stop=lambda: stop.requested)
    except Stopped:
        return _interrupted(stop, None)
    clock.mark("data")
    set_seed(s.seed)  # the same initial weights for the same seed
    model = build_model(cfg, tokenizer)
    clock.mark("model")
    resume = _resume_from(s, args)
    if resume and args.should_save:
        truncate_after(out / "metrics.jsonl", _checkpoint_step(resume))
    if cfg.decisions.auto_batch.value:
        from trainer.run.batch_search import apply_auto_batch

        apply_auto_batch(cfg, args, model, len(dataset), resume)
    trainer = AtomicCheckpointTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        eval_dataset=eval_dataset,
        data_collator=default_data_collator,
        processing_class=tokenizer,
        callbacks=_callbacks(cfg, model, stop, clock),
        **_optimizer_override(cfg, args),
    )
    trainer.checkpoint_info = {"hub": cfg.hub} if cfg.hub else {}  # commits a resumed run keeps (trainer.hub.models)
    if eval_dataset is not None:
        EvalMetricsCallback(out / "metrics.jsonl").install(trainer)
    if stop.requested and args.world_size == 1:  # several ranks agree on the stop step inside the loop
        return _interrupted(stop, None)
    with resuming_from(resume):
        trainer.train(resume_from_checkpoint=resume)
    if stop.requested and trainer.state.global_step < trainer.state.max_steps:
        return _interrupted(stop, trainer.state.global_step)
    trainer.save_final(out / "final", tokenizer)
    log.info("finished: %d steps; model and tokenizer in %s", trainer.state.global_step, out / "final")
    return EXIT_OK


def _checkpoint_step(path: str) -> int:
    import json

    return int(json.loads((Path(path) / "trainer_state.json").read_text())["global_step"])


def _interrupted(stop: Any, step: int | None) -> int:
    import signal

    name = signal.Signals(stop.signum).name
    if step is None:
        log.warning("interrupted by %s before training started; nothing to save; exit %d", name, stop.exit_code)
    else:
        log.warning("interrupted by %s: checkpoint-%d written; restart to resume; exit %d", name, step, stop.exit_code)
    return stop.exit_code
