"""`python -m trainer doctor --memory [--json] [--gpu NAME|SIZE]`: will the configured run fit in GPU memory? The
predicted peak per process with its parts (trainer.memory.predict), against this machine's GPU or a described one
(trainer.machine.gpu_memory's table, or a size), and where it does not fit, the cheapest changes that would, each
predicted again (trainer.memory.fit). Exit 2 where it does not fit or the settings are wrong."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from trainer.errors import EXIT_OK, EXIT_USER, ConfigError
from trainer.machine.gpu_memory import described_gpu
from trainer.machine.hardware import Hardware, probe_libraries
from trainer.memory.fit import ERROR, cheaper, describe, gib, plan_of, verdict, vllm_colocated
from trainer.memory.model_config import ShapeUnknown

if TYPE_CHECKING:
    from trainer.config.inputs import Inputs


def described_hardware(text: str) -> Hardware:
    """The machine `--gpu` describes: one GPU of that memory (a table GPU's compute capability, else Ampere's), so
    that the decisions (precision, optimizer, attention) are those of a GPU run."""
    from trainer.machine.gpu_memory import CAPABILITY

    name, total = described_gpu(text)
    capability = CAPABILITY.get(name, (8, 0))
    return Hardware(device="cuda", gpu_count=1, gpu_name=name, capability=capability, total_memory_bytes=total,
                    bf16=capability >= (8, 0), tf32=capability >= (8, 0), libraries=probe_libraries())  # fmt: skip


def refuse_unreadable_model(inputs: Inputs) -> None:
    """The run's own checks of TRAIN_MODEL alone (a preset, a folder with config.json, a Hub ID, and for a Hub ID the
    Hub's answer: offline and not in the cache, it names `fetch`); not the rest of the run's checks, which ask this
    machine (its libraries, its vLLM), when --gpu plans for another."""
    from trainer.config.paths import model_problems

    problems = model_problems(inputs.settings) or inputs.hub.problems_of.get("model", [])
    if problems:
        raise ConfigError(*(f"doctor --memory: {problem}" for problem in problems))


def not_counted(cfg: Any) -> str | None:
    """What of the model the prediction leaves out: the tower and projector of a vision-language family that
    trainer.memory.vision_shape does not model (the modelled families' are counted)."""
    from trainer.memory.vision import unmodelled

    return unmodelled(cfg)


def main(args: argparse.Namespace) -> int:
    from trainer import config

    try:
        hw = described_hardware(args.gpu) if args.gpu else None
    except ValueError as exc:
        raise ConfigError(f"doctor --memory --gpu {args.gpu}: {exc}") from None
    inputs = config.Inputs(config.parse_settings())
    refuse_unreadable_model(inputs)
    cfg = config.resolve(inputs, hw, import_heavy=hw is None)
    try:
        plan = plan_of(cfg)
    except ShapeUnknown as exc:
        raise ConfigError(f"doctor --memory: TRAIN_MODEL={cfg.settings.model}: {exc}") from None
    from trainer.memory.vision import predict_model

    prediction = predict_model(plan)
    device = cfg.hardware.total_memory_bytes if cfg.hardware.is_gpu else None
    where = cfg.hardware.gpu_name or "no GPU"
    fits = device is None or prediction.peak <= device
    options = [] if fits or device is None else cheaper(plan, device)
    if args.json:
        report = verdict(prediction, device or 0) | {"gpu": where, "batch": plan.batch, "seq_len": plan.seq_len}
        report["fits"] = fits if device else None
        report["not_counted"] = not_counted(cfg)
        report["changes"] = [{"settings": o.settings, "note": o.note, "predicted_peak_bytes": o.prediction.peak}
                             for o in options]  # fmt: skip
        print(json.dumps(report, indent=2))
    else:
        print("\n".join(describe(prediction, device, where)))
        if cfg.decisions.auto_batch.value:
            print("  TRAIN_AUTO_BATCH is on: the run searches the largest batch that fits, from this prediction")
        left_out = not_counted(cfg)
        if left_out:
            print(f"  Not counted: {left_out}")
        if device is None and vllm_colocated(cfg.settings):
            print(f"  vLLM colocated takes TRAIN_RL_VLLM_MEMORY={cfg.settings.rl_vllm_memory:g} of the GPU's memory "
                  "on top of this: counted with --gpu")  # fmt: skip
        if device is None:
            print("No GPU here: plan for one with --gpu NAME or --gpu SIZE (e.g. --gpu H100-80GB, --gpu 24GiB).")
        elif fits:
            print(f"Fits, with {gib(device - prediction.peak)} to spare (the prediction's error on GPUs is "
                  f"unmeasured; a run is refused only beyond {ERROR:.0%} over).")  # fmt: skip
        else:
            print(f"Does not fit: {gib(prediction.peak - device)} over.")
            print("Changes predicted to fit:" if options else "No change of those tried fits.")
            for o in options:
                print(f"  {o.settings}: {gib(o.prediction.peak)} ({o.note})")
    sys.stdout.flush()
    return EXIT_OK if fits else EXIT_USER
