"""`python -m trainer doctor [--json]`: what this machine can do, and whether the configured run can work.

Every check is a `Probe` (probes.py), one line of the report; a probe with status "fail" makes the exit code 2 and
its `fix` says what to do.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict
from typing import Any

from trainer.config.parse import default_output_dir
from trainer.data.discovery import DEFAULT_DATA, discover
from trainer.doctor.probes import (
    FAIL,
    INFO,
    OK,
    WARN,
    Probe,
    apex_probe,
    bitsandbytes_probe,
    cache_probe,
    capability_probes,
    chat_probe,
    data_probe,
    deepspeed_probe,
    driver_floor_probe,
    flash_attn_probe,
    gpu_probes,
    limits_probes,
    output_probe,
    settings_and_config_probe,
    torch_probes,
    unsupported_probe,
    user_probe,
    versions_probe,
)  # fmt: skip
from trainer.errors import EXIT_OK, EXIT_USER
from trainer.machine import hardware


def register(parser: argparse.ArgumentParser) -> None:
    """`doctor`'s arguments, on the parser trainer/__main__.py made for it (trainer/commands.py)."""
    parser.description = (
        "Check this machine (GPUs, libraries, limits, paths) and the TRAIN_* configuration; "
        "exit 2 with the reasons when the configured run cannot work here."
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--memory", action="store_true",
                        help="will the configured run fit in GPU memory: the predicted peak per process, its parts, "
                             "and the cheapest changes that would fit (docs/running.md, 'Will it fit?')")
    parser.add_argument("--gpu", metavar="NAME|SIZE",
                        help="with --memory: plan for another GPU: a name (H100-80GB, A100-40GB, L40S, RTX-4090, "
                             "...) or a size (24GiB, 80GB)")
    parser.set_defaults(func=main)


# --- report --------------------------------------------------------------------------------------


def collect() -> list[Probe]:
    hw = hardware.probe()
    inputs, config_probe = settings_and_config_probe(hw)
    settings = inputs.settings if inputs else None
    env_data = os.environ.get("TRAIN_DATA") or DEFAULT_DATA
    source = inputs.data if inputs else discover(env_data, os.environ.get("TRAIN_TEXT_FIELD") or "text")
    output_path = settings.output_dir if settings else (os.environ.get("TRAIN_OUTPUT_DIR") or default_output_dir())
    num_workers = settings.num_workers if settings else 2
    return [
        *gpu_probes(hw),
        *torch_probes(hw),
        driver_floor_probe(hw),
        *capability_probes(hw),
        flash_attn_probe(hw),
        apex_probe(),
        deepspeed_probe(),
        bitsandbytes_probe(hw),
        versions_probe(),
        unsupported_probe(),
        *limits_probes(hw, num_workers),
        user_probe(),
        cache_probe(),
        data_probe(source),
        *([chat_probe(inputs)] if inputs and source.ok else []),
        output_probe(output_path),
        config_probe,
    ]


def to_json(probes: list[Probe]) -> dict:
    problems = [f"{probe.label}: {probe.fix}" for probe in probes if probe.status == FAIL]
    report: dict[str, Any] = {"ok": not problems, "problems": problems}
    report.update({probe.key: probe.value for probe in probes})
    report["checks"] = [asdict(probe) for probe in probes]
    return report


def print_table(probes: list[Probe]) -> None:
    from rich.console import Console
    from rich.table import Table

    marks = {OK: "[green]ok[/]", INFO: "", WARN: "[yellow]warn[/]", FAIL: "[red]FAIL[/]"}
    table = Table(title="trainkit doctor", show_lines=False)
    table.add_column("check", style="bold")
    table.add_column("found")
    table.add_column("")
    for probe in probes:
        found = probe.shown + (f"\n[dim]{probe.fix}[/]" if probe.fix and probe.status in (WARN, FAIL) else "")
        table.add_row(probe.label, found, marks[probe.status])
    console = Console()
    console.print(table)
    failed = [probe for probe in probes if probe.status == FAIL]
    if failed:
        console.print(f"[red]The configured run cannot work here ({len(failed)} problem(s)):[/]")
        for probe in failed:
            console.print(f"  - {probe.label}: {probe.fix}")
    else:
        console.print("[green]The configured run can work here.[/]")


def main(args: argparse.Namespace) -> int:
    if args.memory or args.gpu:
        from trainer.doctor import memory

        return memory.main(args)
    probes = collect()
    if args.json:
        print(json.dumps(to_json(probes), indent=2, default=str))
    else:
        print_table(probes)
    return EXIT_OK if all(probe.status != FAIL for probe in probes) else EXIT_USER
