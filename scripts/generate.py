"""Regenerate every derived text from its single source, or check that none drifted.

Sources: images/versions.toml (the image matrix), trainer/config/schema/ (the TRAIN_* schema) and
trainer/commands.py (the trainer's commands).
Derived: the Dockerfile's ARG defaults, docs/images.md's table, README.md's matrix and variable
tables, .env.example, the release workflow's job matrix (.github/workflows/release.yml) and the
entrypoint's command list and dispatch lists (entrypoints/entrypoint.sh).

    python scripts/generate.py           # rewrite what drifted
    python scripts/generate.py --check   # exit 1 naming what drifted
"""

from __future__ import annotations

import host_tools  # noqa: F401  # isort: skip  (first: missing host tools are one line, not a traceback)
import argparse
import re
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import matrix
import release_matrix
from errors import exit_missing_package

try:  # the installed project (`pip install -e .`); trainer.config's schema and docs import pydantic only, never torch
    from trainer import commands as trainer_commands
    from trainer.config import docs as train_docs
except ModuleNotFoundError as missing:
    exit_missing_package(missing)

ROOT = Path(__file__).resolve().parent.parent

README = ROOT / "README.md"
ENV_EXAMPLE = ROOT / ".env.example"
ENTRYPOINT = ROOT / "entrypoints" / "entrypoint.sh"

README_BLOCKS: dict[str, Callable[[], str]] = {
    "image matrix": lambda: matrix.readme_table(matrix.load()),
    "TRAIN_* table": train_docs.markdown_table,
}


def replace_block(path: Path, text: str, begin: str, end: str, body: str) -> str:
    """`text` (of `path`) with what lies between the `begin` and `end` marker lines replaced by `body`: the one
    replacer of generated blocks."""
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"error: {path.name} lacks the generated block markers: {begin.strip()} ... {end.strip()}")
    return pattern.sub(lambda _m: begin + body + end, text)


def readme_markers(name: str) -> tuple[str, str]:
    return f"<!-- BEGIN {name} (scripts/generate.py) -->\n", f"<!-- END {name} -->\n"


def entrypoint_help() -> str:
    """The entrypoint's header: one comment line per trainer command."""
    shown = {c.name: f"{c.name} {c.usage}".strip() for c in trainer_commands.COMMANDS}
    width = max(map(len, shown.values()))
    lines = [f"#   {shown[c.name]:<{width}}  {c.help}" for c in trainer_commands.COMMANDS]
    wrap = textwrap.TextWrapper(width=120, subsequent_indent="#" + " " * (width + 5))
    return "".join(f"{line}\n" for command in lines for line in wrap.wrap(command))


def entrypoint_lists() -> str:
    """The entrypoint's dispatch lists: through the launcher (distributed), or `python -m trainer NAME`."""
    launched = " ".join(trainer_commands.names(distributed=True))
    plain = " ".join(trainer_commands.names(distributed=False))
    return f"launched_commands=({launched})\ntrainer_commands=({plain})\n"


ENTRYPOINT_BLOCKS: dict[str, Callable[[], str]] = {"commands": entrypoint_help, "command lists": entrypoint_lists}


def rendered() -> dict[Path, str]:
    """Every derived file as it should read now."""
    readme = README.read_text()
    for name, render in README_BLOCKS.items():
        readme = replace_block(README, readme, *readme_markers(name), render())
    out = {README: readme, ENV_EXAMPLE: train_docs.env_example()}
    table = matrix.load()
    for path, (begin, end, render_block) in matrix.BLOCKS.items():
        out[path] = replace_block(path, path.read_text(), begin, end, render_block(table))
    workflow = release_matrix.WORKFLOW
    text = workflow.read_text()
    for begin, end, render_block in release_matrix.BLOCKS:
        text = replace_block(workflow, text, begin, end, render_block(table))
    out[workflow] = text
    text = ENTRYPOINT.read_text()
    for name, render in ENTRYPOINT_BLOCKS.items():
        text = replace_block(ENTRYPOINT, text, f"# BEGIN {name} (scripts/generate.py)\n", f"# END {name}\n", render())
    out[ENTRYPOINT] = text
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if anything drifted")
    args = parser.parse_args(argv)
    drifted = {path: text for path, text in rendered().items() if not path.exists() or path.read_text() != text}
    if args.check:
        if drifted:
            names = ", ".join(str(p.relative_to(ROOT)) for p in drifted)
            print(f"out of date with their sources: {names}\n  run `python scripts/generate.py`", file=sys.stderr)
            return 1
        return 0
    for path, text in drifted.items():
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
