"""Print the image's own pip constraints: what the base compiled, pinned; everything else left free.

Runs in the base stage (container side). NGC's own /etc/pip/constraint.txt (25.03 and later) pins every
preinstalled package, RAPIDS' pyarrow 19 among them, which breaks pins such as datasets 5.2 (pyarrow >= 24);
23.07 to 24.12 have none, so nothing protects their torch. This file replaces it (PIP_CONSTRAINT):

- pinned exactly: torch, triton, numpy (compiled extensions are built against its ABI), every nvidia-* package,
  and every package that requires torch and ships shared objects (torchvision, transformer_engine, flash_attn,
  apex, ...): upgrading any of them breaks what was compiled against the others;
- their own requirements, as they declare them (e.g. `sympy>=1.13.3`), so nothing moves out of their range;
- nothing else: pure-Python packages are free to move to what the image's pins need.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import sys

try:
    from packaging.requirements import InvalidRequirement, Requirement
except ImportError:  # bases without `packaging` installed: pip vendors the same module
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement

ALWAYS = {"torch", "triton", "pytorch-triton", "numpy"}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed() -> dict[str, md.Distribution]:
    dists: dict[str, md.Distribution] = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name:
            dists.setdefault(normalize(name), dist)
    return dists


def requirements(dist: md.Distribution) -> list[Requirement]:
    """What `dist` requires in this environment (no extras)."""
    out = []
    for raw in dist.requires or []:
        try:
            req = Requirement(raw)
        except InvalidRequirement:
            continue
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            out.append(req)
    return out


def ships_shared_objects(dist: md.Distribution) -> bool:
    return any(".so" in str(f).rsplit("/", 1)[-1] for f in dist.files or [])


def compiled(dists: dict[str, md.Distribution]) -> list[str]:
    """Names of the packages the base compiled (see the module docstring)."""
    names = []
    for name, dist in dists.items():
        needs_torch = any(normalize(r.name) == "torch" for r in requirements(dist))
        if name in ALWAYS or name.startswith("nvidia-") or (needs_torch and ships_shared_objects(dist)):
            names.append(name)
    return sorted(names)


def constraints(dists: dict[str, md.Distribution]) -> list[str]:
    pinned = compiled(dists)
    lines = [f"{name}=={dists[name].version}" for name in pinned]
    needed = set()
    for name in pinned:
        for req in requirements(dists[name]):
            if normalize(req.name) not in pinned and str(req.specifier):
                needed.add(f"{normalize(req.name)}{req.specifier}  # {name}")
    return lines + sorted(needed)


def main() -> int:
    dists = installed()
    if "torch" not in dists:
        print("base_constraints: the base has no torch", file=sys.stderr)
        return 1
    print("# The image's own constraints (images/base_constraints.py): what the base compiled, pinned.")
    print("\n".join(constraints(dists)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
