"""The build's check of a real base against its row of images/versions.toml, before anything is built on it.

A row's facts come from NVIDIA's release notes or weaker sources (`verified = false`, the notes say which). The base
itself has the last word: its torch string, the CUDA its torch was built with, its Python, whether apex is there and
whether it ships NGC's pip constraint file are read inside it, and every difference from the row fails the build,
naming each one, so nothing unverified ships. Stand-ins (known to differ) and `--base IMAGE` are not checked.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Protocol

import docker
from errors import UserError
from matrix import Entry, Matrix

CONSTRAINT_FILE = "/etc/pip/constraint.txt"
FIRST_CONSTRAINT_RELEASE = (25, 3)  # NVIDIA's 25.12 release notes: the file exists "starting from the 25.03 release"

PROBE = f"""
import importlib.util, json, os, sys
facts = {{"python": "%d.%d" % sys.version_info[:2], "apex": importlib.util.find_spec("apex") is not None,
         "constraint_file": os.path.isfile("{CONSTRAINT_FILE}")}}
try:
    import torch
    facts.update(torch=torch.__version__, cuda=torch.version.cuda)
except Exception as exc:
    facts["torch_error"] = f"{{type(exc).__name__}}: {{exc}}"
print(json.dumps(facts))
"""


class PlanLike(Protocol):
    """What this check reads of build.py's Plan."""

    flavor: str
    cuda: str | None
    standin: bool
    rl: bool


@dataclass(frozen=True)
class BaseFacts:
    """What a base image is, read inside it."""

    torch: str
    cuda: str | None  # torch.version.cuda: "13.1"; None for a CPU build
    python: str
    apex: bool
    constraint_file: bool


def read_base(client: docker.DockerClient, image: str) -> BaseFacts:
    """The base's facts, read by its own Python (entrypoint bypassed); a UserError where it has no torch."""
    try:
        out = client.containers.run(image, ["-c", PROBE], entrypoint="python", remove=True, stdout=True, stderr=False)
    except docker.errors.ContainerError as exc:
        why = (exc.stderr or b"").decode(errors="replace").strip().splitlines()[-1:] or [str(exc)]
        raise UserError(f"{image} cannot run `python` (a trainkit base needs one): {why[0]}") from None
    facts = json.loads(out.decode().strip().splitlines()[-1])
    if "torch_error" in facts:
        raise UserError(f"{image} has no importable torch (a trainkit base needs one): {facts['torch_error']}")
    return BaseFacts(facts["torch"], facts["cuda"], facts["python"], facts["apex"], facts["constraint_file"])


def _minor(version: str | None) -> str:
    return ".".join((version or "none").split(".")[:2])


def constraint_expected(entry: Entry) -> bool:
    year, month = (int(part) for part in entry.ngc.split("."))
    return (year, month) >= FIRST_CONSTRAINT_RELEASE


def differences(entry: Entry, facts: BaseFacts) -> list[str]:
    """Each way the base differs from what its row says, as a line naming both."""
    found = []
    if facts.torch != entry.torch:
        found.append(f'torch: the base reports "{facts.torch}", the row says torch = "{entry.torch}"')
    if _minor(facts.cuda) != entry.cuda:
        found.append(f"CUDA: the base's torch was built with CUDA {facts.cuda or 'none (a CPU build)'}, "
                     f'the row is CUDA {entry.cuda} (cuda_full = "{entry.cuda_full}")')  # fmt: skip
    if facts.python != entry.python:
        found.append(f'Python: the base runs {facts.python}, the row says python = "{entry.python}"')
    if facts.apex != entry.includes.get("apex", False):
        has = "ships apex" if facts.apex else "has no apex"
        found.append(f"apex: the base {has}, the row says includes.apex = {str(entry.includes.get('apex')).lower()}")
    if facts.constraint_file != constraint_expected(entry):
        has = "has" if facts.constraint_file else "has no"
        found.append(f"constraint file: the base {has} {CONSTRAINT_FILE}, which NGC ships from 25.03 on "
                     f"(the row's release is {entry.ngc})")  # fmt: skip
    return found


def checked_entry(matrix: Matrix, plan: PlanLike, args: argparse.Namespace) -> Entry | None:
    """The row whose facts the base must match: none for a stand-in or `--base IMAGE`; with `--ngc YY.MM`, the row
    of that release (none where the matrix has no such row)."""
    if plan.standin or args.base or plan.flavor != "cuda" or plan.cuda is None:
        return None
    if args.ngc and not plan.rl:
        return matrix.entry_for_ngc(args.ngc)
    return matrix.row(plan.cuda, plan.rl)


def check(entry: Entry, image: str, facts: BaseFacts) -> str:
    """One line saying the base matches its row, or a UserError naming every difference."""
    found = differences(entry, facts)
    if found:
        raise UserError(
            f"the base {image} is not what images/versions.toml says of {entry.title} (NGC {entry.ngc}):\n  - "
            + "\n  - ".join(found)
            + "\n  Correct the row from the base (and the pins that follow its torch, such as torchao), then build "
            "again: the build does not ship a base whose facts are unverified."
        )
    return f"the base matches {entry.title}: torch {facts.torch}, CUDA {facts.cuda}, Python {facts.python}"
