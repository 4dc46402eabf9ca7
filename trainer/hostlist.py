"""Slurm hostlist expansion (`node[01-03,7],gpu-a[1-2]` -> node01 node02 node03 node7 gpu-a1 gpu-a2).

The syntax is Slurm's: hosts separated by commas outside brackets; a bracket holds comma-separated
numbers or `lo-hi` ranges, zero-padded to the width of `lo`; several brackets in one name multiply
(`r[1-2]n[1-2]` -> r1n1 r1n2 r2n1 r2n2). Pure Python, so no `scontrol` is needed inside the container.
"""

from __future__ import annotations

import itertools
import re

_MAX_HOSTS = 1_000_000


class HostlistError(ValueError):
    """A hostlist that does not follow Slurm's syntax."""


def split_top_level(hostlist: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    items, depth, current = [], 0, []
    for char in hostlist:
        if char == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested '[' in hostlist {hostlist!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unmatched ']' in hostlist {hostlist!r}")
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise HostlistError(f"unclosed '[' in hostlist {hostlist!r}")
    items.append("".join(current))
    return [item.strip() for item in items if item.strip()]


def expand_range(spec: str, hostlist: str) -> list[str]:
    """`01-03,7` -> ['01', '02', '03', '7']."""
    values = []
    for part in spec.split(","):
        part = part.strip()
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match:
            raise HostlistError(f"bad range {part!r} in hostlist {hostlist!r} (expected N or LO-HI)")
        lo_text, hi_text = match.group(1), match.group(2)
        if hi_text is None:
            values.append(lo_text)
            continue
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise HostlistError(f"range {part!r} in hostlist {hostlist!r} goes backwards")
        width = len(lo_text)
        values.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return values


def expand_item(item: str, hostlist: str) -> list[str]:
    """One name with zero or more bracket groups -> every host it stands for."""
    pieces = re.split(r"\[([^\]]*)\]", item)
    # pieces alternate: literal, range, literal, range, ..., literal
    choices = [[piece] if i % 2 == 0 else expand_range(piece, hostlist) for i, piece in enumerate(pieces)]
    count = 1
    for options in choices:
        count *= len(options)
    if count > _MAX_HOSTS:
        raise HostlistError(f"hostlist {hostlist!r} expands to more than {_MAX_HOSTS} hosts")
    return ["".join(combo) for combo in itertools.product(*choices)]


def expand_hostlist(hostlist: str) -> list[str]:
    """Every host named by a Slurm hostlist, in order."""
    hosts: list[str] = []
    for item in split_top_level(hostlist):
        hosts.extend(expand_item(item, hostlist))
    if not hosts:
        raise HostlistError(f"hostlist {hostlist!r} names no host")
    return hosts


def first_host(hostlist: str) -> str:
    """The first host of a hostlist, without expanding the rest."""
    first = split_top_level(hostlist)
    if not first:
        raise HostlistError(f"hostlist {hostlist!r} names no host")
    pieces = re.split(r"\[([^\]]*)\]", first[0])
    return "".join(piece if i % 2 == 0 else expand_range(piece, hostlist)[0] for i, piece in enumerate(pieces))
