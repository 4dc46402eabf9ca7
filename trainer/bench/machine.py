"""The machine a bench runs on, as the report describes it."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from trainer.bench.runner import error_line


def machine() -> dict:
    """Device and versions for the report, probed in a child process.

    Probing here would create a CUDA context in this process, holding GPU memory the rows then lack.
    """
    code = "import json; from trainer.bench.machine import describe_machine; print(json.dumps(describe_machine()))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        first = error_line([line for line in proc.stderr.splitlines() if line.strip()])
        print(f"warning: could not probe the hardware ({first}); assuming no GPU", file=sys.stderr)
        return {"on_gpu": False, "device": "unknown (hardware probe failed)", "torch": "?"}


def describe_machine() -> dict:
    """Run in a child by machine(): what the report says about this machine."""
    from trainer.machine.hardware import probe

    hw = probe()
    device = hw.describe() if hw.is_gpu else f"CPU: {_cpu_name()}, {hw.cpu_count} cores"
    if hw.is_gpu and hw.cuda_version:
        device += f", CUDA {hw.cuda_version}"
    return {"on_gpu": hw.is_gpu, "device": device, "torch": hw.torch_version, "auto_compile": long_run_compiles(hw),
            "capability": list(hw.capability) if hw.capability else None}  # fmt: skip


def long_run_compiles(hw: Any) -> bool:
    """Whether TRAIN_COMPILE=auto compiles a long run of the user's configuration with the trainer's defaults here
    (the bench's rows are too short for auto to compile them; the `auto` row is measured as a real run would be)."""
    import os

    from trainer.bench.catalogue import AUTO_ENV, BASELINE_ENV
    from trainer.config import parse_settings
    from trainer.config.speed import decide_compile
    from trainer.errors import ConfigError

    try:
        settings = parse_settings({**os.environ, **BASELINE_ENV, **AUTO_ENV, "TRAIN_MAX_STEPS": "-1"})
        return bool(decide_compile(settings, hw, check_backend=False).value)
    except ConfigError:
        return False


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions(torch_version: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    parts = [f"python {platform.python_version()}", f"torch {torch_version}"]
    for package in ("transformers", "accelerate", "deepspeed", "peft", "flash-attn", "bitsandbytes"):
        try:
            parts.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            continue
    return ", ".join(parts)
