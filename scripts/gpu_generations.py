"""Which GPU generations a TORCH_CUDA_ARCH_LIST covers (the image table's "GPUs" column, scripts/matrix.py)."""

from __future__ import annotations

import re

# Compute capabilities of each GPU generation (NVIDIA's "CUDA GPUs" list), oldest first.
GENERATIONS = {
    "Maxwell": ("5.0", "5.2", "5.3"),
    "Pascal": ("6.0", "6.1", "6.2"),
    "Volta": ("7.0", "7.2"),
    "Turing": ("7.5",),
    "Ampere": ("8.0", "8.6", "8.7"),
    "Ada": ("8.9",),
    "Hopper": ("9.0",),
    "Blackwell": ("10.0", "10.3", "11.0", "12.0", "12.1"),
}


def _cc(text: str) -> tuple[int, int]:
    """"8.6", "9.0a", "12.0+PTX" -> (major, minor)."""
    major, minor = re.match(r"(\d+)(?:\.(\d+))?", text).groups()
    return int(major), int(minor or 0)


def gpu_generations(arch_list: str) -> list[str]:
    """The GPU generations that run the machine code of `arch_list` (TORCH_CUDA_ARCH_LIST).

    Code for X.Y runs on X.Z with Z >= Y (NVIDIA's binary compatibility); a generation counts when one of its
    compute capabilities is covered. PTX (+PTX) is not counted: a JIT compile at start-up is a fallback."""
    archs = [_cc(a) for a in re.split(r"[;\s]+", arch_list.strip()) if a]
    return [
        name
        for name, ccs in GENERATIONS.items()
        if any(a[0] == cc[0] and a[1] <= cc[1] for a in archs for cc in map(_cc, ccs))
    ]


def describe_generations(arch_list: str) -> str:
    """"Turing to Blackwell" for a run of consecutive generations, else a list."""
    found = gpu_generations(arch_list)
    order = list(GENERATIONS)
    if len(found) > 2 and order.index(found[-1]) - order.index(found[0]) == len(found) - 1:
        return f"{found[0]} to {found[-1]}"
    return ", ".join(found) or "-"
