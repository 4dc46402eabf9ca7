"""The release pipeline's job matrix, generated from images/versions.toml (run through scripts/generate.py).

.github/workflows/release.yml builds one row per job: on a tag every CUDA row of the matrix and the online-RL row
(`build.py --rl`), nightly (or by hand) the default row. Both lists live in generated blocks of the workflow, so a
row added to versions.toml is released without editing the workflow by hand.
"""

from __future__ import annotations

from matrix import RL_ROW, ROOT, Entry, Matrix

WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"


def _row(entry: Entry, indent: str) -> str:
    if entry.key == RL_ROW:  # build-row.yml's `rl` input: `build.py --rl`; its ngc is NVIDIA's vLLM release
        return f'{indent}- {{cuda: "{entry.cuda}", ngc: "{entry.ngc}", tag: {RL_ROW}, rl: true}}\n'
    return f'{indent}- {{cuda: "{entry.cuda}", ngc: "{entry.ngc}", tag: {entry.cuda_tag}}}\n'


def every_row(matrix: Matrix) -> str:
    """The tag job's matrix: every CUDA row and the online-RL row, one job each."""
    rows = [*matrix.entries.values(), *([matrix.rl] if matrix.rl else [])]
    return "          include:\n" + "".join(_row(e, "            ") for e in rows)


def default_row(matrix: Matrix) -> str:
    """The nightly job's matrix: the default row alone."""
    return "          include:\n" + _row(matrix.entry(matrix.default_cuda), "            ")


def _markers(name: str) -> tuple[str, str]:
    return (f"          # BEGIN {name} (scripts/generate.py from images/versions.toml)\n",
            f"          # END {name}\n")  # fmt: skip


# (begin marker, end marker, render) for each generated block of the workflow; scripts/generate.py replaces them.
BLOCKS = [(*_markers("every row"), every_row), (*_markers("default row"), default_row)]
