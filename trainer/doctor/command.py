"""`python -m trainer doctor [--json]`: what this machine can do, and whether the configured run can work.

Every check is a `Row` (rows.py); a row with status "fail" makes the exit code 2 and its `fix` says what to do.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict
from typing import Any

from trainer.data.discovery import DEFAULT_DATA, discover, source_of
from trainer.doctor.rows import (
    FAIL,
    INFO,
    OK,
    WARN,
    Row,
    apex_row,
    bitsandbytes_row,
    cache_row,
    capability_rows,
    chat_row,
    data_row,
    deepspeed_row,
    driver_floor_row,
    flash_attn_row,
    gpu_rows,
    limits_rows,
    output_row,
    settings_and_config_row,
    torch_rows,
    unsupported_row,
    user_row,
    versions_row,
)  # fmt: skip
from trainer.errors import EXIT_OK, EXIT_USER
from trainer.run import hardware


def register(commands: Any) -> None:
    """Add `doctor` to `python -m trainer`'s subcommands."""
    parser = commands.add_parser(
        "doctor",
        help="what this machine can do, and whether the configured run can work here",
        description="Check this machine (GPUs, libraries, limits, paths) and the TRAIN_* configuration; "
        "exit 2 with the reasons when the configured run cannot work here.",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=main)


# --- report --------------------------------------------------------------------------------------


def collect() -> list[Row]:
    hw = hardware.probe()
    settings, config_row = settings_and_config_row(hw)
    env_data = os.environ.get("TRAIN_DATA") or DEFAULT_DATA
    source = source_of(settings) if settings else discover(env_data, os.environ.get("TRAIN_TEXT_FIELD") or "text")
    output_path = settings.output_dir if settings else os.environ.get("TRAIN_OUTPUT_DIR", "/output")
    num_workers = settings.num_workers if settings else 2
    return [
        *gpu_rows(hw),
        *torch_rows(hw),
        driver_floor_row(hw),
        *capability_rows(hw),
        flash_attn_row(hw),
        apex_row(),
        deepspeed_row(),
        bitsandbytes_row(hw),
        versions_row(),
        unsupported_row(),
        *limits_rows(hw, num_workers),
        user_row(),
        cache_row(),
        data_row(source),
        *([chat_row(settings, source)] if settings and source.ok else []),
        output_row(output_path),
        config_row,
    ]


def to_json(rows: list[Row]) -> dict:
    problems = [f"{row.label}: {row.fix}" for row in rows if row.status == FAIL]
    report: dict[str, Any] = {"ok": not problems, "problems": problems}
    report.update({row.key: row.value for row in rows})
    report["checks"] = [asdict(row) for row in rows]
    return report


def print_table(rows: list[Row]) -> None:
    from rich.console import Console
    from rich.table import Table

    marks = {OK: "[green]ok[/]", INFO: "", WARN: "[yellow]warn[/]", FAIL: "[red]FAIL[/]"}
    table = Table(title="trainkit doctor", show_lines=False)
    table.add_column("check", style="bold")
    table.add_column("found")
    table.add_column("")
    for row in rows:
        found = row.shown + (f"\n[dim]{row.fix}[/]" if row.fix and row.status in (WARN, FAIL) else "")
        table.add_row(row.label, found, marks[row.status])
    console = Console()
    console.print(table)
    failed = [row for row in rows if row.status == FAIL]
    if failed:
        console.print(f"[red]The configured run cannot work here ({len(failed)} problem(s)):[/]")
        for row in failed:
            console.print(f"  - {row.label}: {row.fix}")
    else:
        console.print("[green]The configured run can work here.[/]")


def main(args: argparse.Namespace) -> int:
    rows = collect()
    if args.json:
        print(json.dumps(to_json(rows), indent=2, default=str))
    else:
        print_table(rows)
    return EXIT_OK if all(row.status != FAIL for row in rows) else EXIT_USER
