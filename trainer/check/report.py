"""check_report.json (written whole, then renamed) and the table `check` prints."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write(path: Path, report: dict[str, Any]) -> None:
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(json.dumps(report, indent=1) + "\n")
    os.replace(staging, path)


def _cell(text: str, width: int = 28) -> str:
    shown = json.dumps(text)[1:-1]
    return shown if len(shown) <= width else shown[: width - 3] + "..."


def table(report: dict[str, Any]) -> list[str]:
    answers = report["answers"]
    lines = [f"check {report['endpoint']} (model {report['model']}) against {report['against']}",
             f"  served: {report['served']}", f"  reference: {report['reference']['source']}",
             f"  tokenizer: {report['tokenizer']}", "",
             "| # | prompt | rendered prompt (tokens) | answer | reference | agreeing prefix | end |",
             "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for n, row in enumerate(report["prompts"], 1):
        tokens = f"{row['server_tokens'] if row['server_tokens'] is not None else '?'}/{row['export_tokens']}"
        end = row["finish"] + (f" ({row['stop']})" if row["stop"] else "")
        cells = [str(n), _cell(row["prompt"]), f"{tokens}: {_cell(row['rendering'], 40)}", _cell(row["answer"]),
                 _cell(row["reference"]), f"{row['prefix']}/{row['tokens']}", _cell(end, 60)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"answers agreeing: {answers['agreeing']}/{answers['prompts']} (mean agreeing prefix "
              f"{answers['mean_prefix']:.1f} of {answers['tokens']} tokens); needed {answers['required']} "
              f"({answers['bar']})"]  # fmt: skip
    lines += [f"end of turn: {probe}" for probe in report["end_of_turn"]]
    if report["findings"]:
        lines += ["", f"check FAILED ({len(report['findings'])}):"] + [f"- {f['what']}: {f['message']}"
                                                                       for f in report["findings"]]  # fmt: skip
    else:
        lines += ["", "check passed: the endpoint answers as the export does"]
    return lines
