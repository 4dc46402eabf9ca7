"""Whether this host's NVIDIA driver can run this image: its CUDA row's floor, forward compatibility, or the row
to use instead. The floors come from the build (scripts/build.py sets them from images/versions.toml). Torch-free:
scripts/driver.py takes the driver -> row rule from here."""

from __future__ import annotations

import os
import re
from pathlib import Path

FLOOR_ENV = "TRAINKIT_DRIVER_MIN"  # this image's row: the oldest driver its CUDA runs on
ROWS_ENV = "TRAINKIT_DRIVER_FLOORS"  # every row of the matrix, "12.1=530,12.4=550.54.15,..."
COMPAT_LIBS = Path("/usr/local/cuda/compat")  # NGC's CUDA forward-compatibility libraries
# Forward compatibility works on datacenter GPUs only (NVIDIA's CUDA compatibility guide).
DATACENTER_GPU = re.compile(
    r"\b(Tesla|[ABHL]\d{1,3}[GS]?|GB\d{3}|GH\d{3}|V100|P100|P40|T4)\b", re.IGNORECASE
)


def version_key(version: str) -> tuple[int, ...]:
    """'570.124.06' -> (570, 124, 6); a bare branch like '530' compares as its first release. Also for CUDA (12.8)."""
    return tuple(int(part) for part in re.findall(r"\d+", version))


def newest_row_for(driver: str, floors: dict[str, str]) -> str | None:
    """The driver -> CUDA row rule (here, for doctor, and for scripts/driver.py's `--cuda auto`): the newest row
    (CUDA X.Y) whose driver floor `driver` meets; None when it meets none."""
    fitting = [cuda for cuda, floor in floors.items() if version_key(floor) <= version_key(driver)]
    return max(fitting, key=version_key) if fitting else None


def parse_floors(text: str) -> dict[str, str]:
    """'12.1=530,12.4=550.54.15' -> {'12.1': '530', '12.4': '550.54.15'}."""
    pairs = (item.split("=", 1) for item in text.split(",") if "=" in item)
    return {cuda.strip(): floor.strip() for cuda, floor in pairs}


def verdict(driver: str | None, gpu_name: str | None, floor: str, rows: dict[str, str],
            compat_present: bool) -> tuple[str, str, str]:  # fmt: skip
    """(status, what to show, how to fix) for doctor: ok, warn (forward compatibility carries it) or fail."""
    if not floor:
        return "info", "no CUDA floor (CPU image)", ""
    if driver is None:
        return "info", f"no NVIDIA driver visible; this image needs >= {floor}", ""
    if version_key(driver) >= version_key(floor):
        return "ok", f"driver {driver} meets this image's floor (>= {floor})", ""
    instead = newest_row_for(driver, rows)
    other = (f"use the CUDA {instead} image (trainkit:latest-cu{instead.replace('.', '')}), the newest row this driver "
             "runs," if instead else "no row of the matrix runs on it:")  # fmt: skip
    if gpu_name and DATACENTER_GPU.search(gpu_name) and compat_present:
        return ("warn", f"driver {driver} is older than this image's floor ({floor}); CUDA forward compatibility "
                f"applies on the datacenter GPU {gpu_name} (NGC's entrypoint loads {COMPAT_LIBS})",
                f"if CUDA fails to start, {other} or update the driver to >= {floor}")  # fmt: skip
    why = "forward compatibility needs a datacenter GPU" if gpu_name else "no GPU name to judge forward compatibility"
    if gpu_name and DATACENTER_GPU.search(gpu_name):
        why = f"this image has no forward-compatibility libraries ({COMPAT_LIBS})"
    return "fail", f"driver {driver} is older than this image's floor ({floor}); {why}", (
        f"{other} or update the driver to >= {floor}")


def image_floor() -> tuple[str, dict[str, str]]:
    """This image's floor and every row's, as the build recorded them."""
    return os.environ.get(FLOOR_ENV, "").strip(), parse_floors(os.environ.get(ROWS_ENV, ""))
