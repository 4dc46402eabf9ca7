"""The release pipeline's job matrix, generated from images/versions.toml (run through scripts/generate.py).

.github/workflows/release.yml builds one CUDA row per job: on a tag every row of the matrix, nightly (or by hand) the
default row. Both lists live in generated blocks of the workflow, so a row added to versions.toml is released
without editing the workflow by hand.
"""

from __future__ import annotations

import re
from pathlib import Path

from errors import UserError
from matrix import ROOT, Entry, Matrix

WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"


def _row(entry: Entry, indent: str) -> str:
    return f'{indent}- {{cuda: "{entry.cuda}", ngc: "{entry.ngc}", tag: {entry.cuda_tag}}}\n'


def every_row(matrix: Matrix) -> str:
    """The tag job's matrix: every CUDA row, one job each."""
    return "          include:\n" + "".join(_row(e, "            ") for e in matrix.entries.values())


def default_row(matrix: Matrix) -> str:
    """The nightly job's matrix: the default row alone."""
    return "          include:\n" + _row(matrix.entry(matrix.default_cuda), "            ")


BLOCKS = {"every row": every_row, "default row": default_row}


def regenerate(matrix: Matrix, path: Path = WORKFLOW) -> str:
    """The workflow's text with each generated block refreshed."""
    text = path.read_text()
    for name, render in BLOCKS.items():
        begin = f"          # BEGIN {name} (scripts/generate.py from images/versions.toml)\n"
        end = f"          # END {name}\n"
        pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
        if not pattern.search(text):
            raise UserError(f"{path} lacks the generated block markers {begin.strip()!r} ... {end.strip()!r}")
        block = begin + render(matrix) + end
        text = pattern.sub(lambda _m, block=block: block, text)
    return text
