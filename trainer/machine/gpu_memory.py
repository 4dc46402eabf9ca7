"""How much memory a GPU has, by its name, for planning a run on a machine this one is not: the one table of common
GPUs (`doctor --memory --gpu NAME`) and the size form (`--gpu 24GiB`). Torch-free."""

from __future__ import annotations

import re

GIB = 1 << 30
GB = 10**9

# The memory each card reports (torch.cuda.get_device_properties().total_memory is a little under the datasheet
# figure on some cards; the datasheet's is used here).
GPUS: dict[str, int] = {
    "A100-40GB": 40 * GIB,
    "A100-80GB": 80 * GIB,
    "H100-80GB": 80 * GIB,
    "H100-94GB": 94 * GIB,  # H100 NVL
    "H200": 141 * GB,
    "B200": 180 * GB,
    "L40S": 48 * GIB,
    "L4": 24 * GIB,
    "A10G": 24 * GIB,
    "A6000": 48 * GIB,
    "RTX-4090": 24 * GIB,
    "RTX-3090": 24 * GIB,
    "V100-16GB": 16 * GIB,
    "V100-32GB": 32 * GIB,
    "T4": 16 * GIB,
}

# Compute capability, which decides the precision and attention a run gets (bf16 from 8.0).
CAPABILITY: dict[str, tuple[int, int]] = {
    "A100-40GB": (8, 0), "A100-80GB": (8, 0), "H100-80GB": (9, 0), "H100-94GB": (9, 0), "H200": (9, 0),
    "B200": (10, 0), "L40S": (8, 9), "L4": (8, 9), "A10G": (8, 6), "A6000": (8, 6), "RTX-4090": (8, 9),
    "RTX-3090": (8, 6), "V100-16GB": (7, 0), "V100-32GB": (7, 0), "T4": (7, 5),
}  # fmt: skip

SMALLEST, LARGEST = GIB, 1 << 40  # a size outside these is a typo, not a GPU (the largest above holds 180 GB)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(GiB|GB|MiB|MB|TiB|TB)\s*$", re.IGNORECASE)
_UNITS = {"gib": GIB, "gb": GB, "mib": 1 << 20, "mb": 10**6, "tib": 1 << 40, "tb": 10**12}


def _key(name: str) -> str:
    return re.sub(r"[\s_-]+", "", name).upper()


def described_gpu(text: str) -> tuple[str, int]:
    """(name, bytes) for `text`: a name of GPUS (case, spaces and dashes ignored: `rtx 4090`) or a size (`24GiB`,
    `80GB`, from 1 GiB to 1 TiB); ValueError naming what it accepts."""
    size = _SIZE.match(text)
    if size:
        total = int(float(size.group(1)) * _UNITS[size.group(2).lower()])
        if not SMALLEST <= total <= LARGEST:
            raise ValueError(f"{text.strip()} is no GPU's memory: give one between 1 GiB and 1 TiB (e.g. 24GiB, "
                             "80GB), or a GPU's name")  # fmt: skip
        return text.strip(), total
    wanted = _key(text)
    for name, total in GPUS.items():
        if _key(name) == wanted or _key(name).removeprefix("RTX") == wanted:
            return name, total
    raise ValueError(f"unknown GPU {text!r}: give a size (e.g. 24GiB, 80GB) or one of {', '.join(GPUS)}")

