"""Print the trainer's Python requirements (pyproject's dependencies + the `train` extra) minus torch, each
held to its pin from images/versions.toml (the TRAINER_PINS build arg, "name==version ..."), resolved for the
row's Python (ROW_PYTHON, images/versions.toml's `python`): each environment marker is evaluated for that Python,
so the image gets the row's requirement set even where it runs another Python (a stand-in base).

    python trainer_requirements.py PYPROJECT "PINS" [ROW_PYTHON]

Before it prints, the check: the image's Python is the row's. Where it is not, the build fails, except on a
stand-in base (TRAINKIT_STANDIN=1) whose Python asks for the same requirement set as the row's: that difference is
said on stderr (build.py's notes and labels say it too). Without ROW_PYTHON (another base), the image's own Python.

Runs inside the image build (the base owns torch), before the trainer itself is copied, so this layer
only rebuilds when pyproject.toml or a pin changes. A requirement without a pin fails the build: everything
that goes into an image is pinned.
"""

from __future__ import annotations

import os
import re
import sys

try:
    import tomllib
except ImportError:  # Python 3.10 bases: pip vendors the same parser
    from pip._vendor import tomli as tomllib
from pip._vendor.packaging.markers import default_environment
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.specifiers import SpecifierSet

BASE_OWNED = {"torch"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pins(text: str) -> dict[str, str]:
    return {canonical(name): version for name, _, version in (word.partition("==") for word in text.split())}


def running_python() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def holds_on(req: Requirement, python: str) -> bool:
    """Whether `req`'s marker holds on Python `python` (X.Y), on this platform."""
    if req.marker is None:
        return True
    full = default_environment()["python_full_version"] if python == running_python() else f"{python}.0"
    return req.marker.evaluate({"python_version": python, "python_full_version": full})


def requirements(pyproject_path: str, pins: dict[str, str], python: str | None = None) -> list[str]:
    """Each requirement with `==pin` added to its own specifier (pip then refuses a pin outside the range). With
    `python`: only those whose marker holds on it, without the marker (the set is the row's, whatever runs pip)."""
    with open(pyproject_path, encoding="utf-8") as fh:  # text: the tomli of pip 22 (Ubuntu 22.04's) loads no bytes
        project = tomllib.loads(fh.read())["project"]
    texts = [*project.get("dependencies", []), *project.get("optional-dependencies", {}).get("train", [])]
    wanted = [req for req in map(Requirement, texts) if canonical(req.name) not in BASE_OWNED]
    if python is not None:
        wanted = [req for req in wanted if holds_on(req, python)]
    unpinned = [req.name for req in wanted if canonical(req.name) not in pins]
    if unpinned:
        raise SystemExit(f"error: no pin for {', '.join(unpinned)}: add each to [packages] in images/versions.toml "
                         "(everything that goes into an image is pinned)")  # fmt: skip
    for req in wanted:
        req.specifier = req.specifier & SpecifierSet(f"=={pins[canonical(req.name)]}")
        if python is not None:
            req.marker = None
    return [str(req) for req in wanted]


def python_check(pyproject_path: str, pins: dict[str, str], row: str, image: str, standin: bool) -> str:
    """A note when the image's Python `image` may stand for the row's `row`; SystemExit naming why when not."""
    if row == image:
        return f"Python {image}, the row's: the trainer's requirements resolved for it"
    on_row, on_image = requirements(pyproject_path, pins, row), requirements(pyproject_path, pins, image)
    if not standin:
        raise SystemExit(f"error: the base runs Python {image}, but images/versions.toml says the row's is {row}: "
                         "correct the row's `python` (the image's labels carry it), or build on a base with "
                         f"Python {row}")  # fmt: skip
    if on_row != on_image:
        only_row, only_image = sorted(set(on_row) - set(on_image)), sorted(set(on_image) - set(on_row))
        raise SystemExit(f"error: this stand-in base runs Python {image}, the row's is {row}, and the trainer's "
                         f"requirements differ between them (only on {row}: {', '.join(only_row) or 'none'}; only on "
                         f"{image}: {', '.join(only_image) or 'none'}): a stand-in must run its row's Python; give the "
                         "row a [standin_rootfs] with it in images/versions.toml")  # fmt: skip
    return (f"stand-in runs Python {image}, not the row's {row}: the trainer's requirements resolved for {row} "
            f"(the same set on {image})")  # fmt: skip


def main(argv: list[str]) -> None:
    pyproject_path, pins = argv[0], parse_pins(argv[1] if len(argv) > 1 else "")
    row = (argv[2] if len(argv) > 2 else "") or running_python()
    note = python_check(pyproject_path, pins, row, running_python(), os.environ.get("TRAINKIT_STANDIN") == "1")
    print(f"trainer requirements: {note}", file=sys.stderr)
    print("\n".join(requirements(pyproject_path, pins, row)))


if __name__ == "__main__":
    main(sys.argv[1:])
