"""Print the trainer's Python requirements (pyproject's dependencies + the `train` extra) minus torch.

Runs inside the image build (the base owns torch), before the trainer itself is copied, so this layer
only rebuilds when pyproject.toml changes.
"""

from __future__ import annotations

import re
import sys

try:
    import tomllib
except ImportError:  # Python 3.10 bases: pip vendors the same parser
    from pip._vendor import tomli as tomllib

BASE_OWNED = {"torch"}


def requirements(pyproject_path: str) -> list[str]:
    with open(pyproject_path, "rb") as fh:
        project = tomllib.load(fh)["project"]
    wanted = [*project.get("dependencies", []), *project.get("optional-dependencies", {}).get("train", [])]
    return [req for req in wanted if re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower() not in BASE_OWNED]


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1])))
