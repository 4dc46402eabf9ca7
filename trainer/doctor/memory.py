"""`python -m trainer doctor --memory [--json] [--gpu NAME|SIZE]`: will the configured run fit in GPU memory? The
predicted peak per process with its parts (trainer.memory.predict), against this machine's GPU or a described one
(trainer.machine.gpu_memory's table, or a size), and where it does not fit, the cheapest changes that would, each
predicted again (trainer.memory.fit). Exit 2 where it does not fit or the settings are wrong."""

from __future__ import annotations

import argparse
import json
import sys

from trainer.errors import EXIT_OK, EXIT_USER, ConfigError
from trainer.machine.gpu_memory import described_gpu
from trainer.machine.hardware import Hardware, probe_libraries
from trainer.memory.fit import ERROR, cheaper, describe, gib, plan_of, verdict


def described_hardware(text: str) -> Hardware:
    """The machine `--gpu` describes: one GPU of that memory (a table GPU's compute capability, else Ampere's), so
    that the decisions (precision, optimizer, attention) are those of a GPU run."""
    from trainer.machine.gpu_memory import CAPABILITY

    name, total = described_gpu(text)
    capability = CAPABILITY.get(name, (8, 0))
    return Hardware(device="cuda", gpu_count=1, gpu_name=name, capability=capability, total_memory_bytes=total,
                    bf16=capability >= (8, 0), tf32=capability >= (8, 0), libraries=probe_libraries())  # fmt: skip


def main(args: argparse.Namespace) -> int:
    from trainer import config

    try:
        hw = described_hardware(args.gpu) if args.gpu else None
    except ValueError as exc:
        raise ConfigError(f"--gpu: {exc}") from None
    inputs = config.Inputs(config.parse_settings())
    cfg = config.resolve(inputs, hw, import_heavy=hw is None)
    plan = plan_of(cfg)
    from trainer.memory.predict import predict

    prediction = predict(plan)
    device = cfg.hardware.total_memory_bytes if cfg.hardware.is_gpu else None
    where = cfg.hardware.gpu_name or "no GPU"
    fits = device is None or prediction.peak <= device
    options = [] if fits or device is None else cheaper(plan, device)
    if args.json:
        report = verdict(prediction, device or 0) | {"gpu": where, "batch": plan.batch, "seq_len": plan.seq_len}
        report["fits"] = fits if device else None
        report["changes"] = [{"settings": o.settings, "note": o.note, "predicted_peak_bytes": o.prediction.peak}
                             for o in options]  # fmt: skip
        print(json.dumps(report, indent=2))
    else:
        print("\n".join(describe(prediction, device, where)))
        if cfg.decisions.auto_batch.value:
            print("  TRAIN_AUTO_BATCH is on: the run searches the largest batch that fits, from this prediction")
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
