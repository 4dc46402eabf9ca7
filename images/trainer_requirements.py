"""Print the trainer's Python requirements (pyproject's dependencies + the `train` extra) minus torch, each
held to its pin from images/versions.toml (the TRAINER_PINS build arg, "name==version ...").

Runs inside the image build (the base owns torch), before the trainer itself is copied, so this layer
only rebuilds when pyproject.toml or a pin changes. A requirement without a pin fails the build: everything
that goes into an image is pinned.
"""

from __future__ import annotations

import re
import sys

try:
    import tomllib
except ImportError:  # Python 3.10 bases: pip vendors the same parser
    from pip._vendor import tomli as tomllib
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.specifiers import SpecifierSet

BASE_OWNED = {"torch"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pins(text: str) -> dict[str, str]:
    return {canonical(name): version for name, _, version in (word.partition("==") for word in text.split())}


def requirements(pyproject_path: str, pins: dict[str, str]) -> list[str]:
    """Each requirement with `==pin` added to its own specifier (pip then refuses a pin outside the range)."""
    with open(pyproject_path, "rb") as fh:
        project = tomllib.load(fh)["project"]
    texts = [*project.get("dependencies", []), *project.get("optional-dependencies", {}).get("train", [])]
    wanted = [req for req in map(Requirement, texts) if canonical(req.name) not in BASE_OWNED]
    unpinned = [req.name for req in wanted if canonical(req.name) not in pins]
    if unpinned:
        raise SystemExit(f"error: no pin for {', '.join(unpinned)}: add each to [packages] in images/versions.toml "
                         "(everything that goes into an image is pinned)")  # fmt: skip
    for req in wanted:
        req.specifier = req.specifier & SpecifierSet(f"=={pins[canonical(req.name)]}")
    return [str(req) for req in wanted]


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1], parse_pins(sys.argv[2] if len(sys.argv) > 2 else ""))))
