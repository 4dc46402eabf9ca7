"""export's OUT: checked before any work, written into a staging folder, published only when whole.

OUT must not exist, or be an empty folder.
- A new OUT is staged beside it (`.tmp-export-NAME`) and renamed to OUT at the end: one atomic step.
- An existing empty folder (a mount point, a folder made with its owner and mode) stays itself: a mount point can be
  neither removed nor renamed over, and the folder's owner, mode and mount are the user's. The staging folder is made
  inside it, on its filesystem, and its entries are moved up at the end, config.json (adapter_config.json) last, so
  that a folder without it is never taken for a whole export; a failure while moving removes what was moved.
A staging folder a killed export left behind is removed by the next export into the same OUT.

A write that fails for lack of space (trainer/machine/disk.py's rule: the cause, else a probe made before the
staging folder is removed) ends with `ExportDiskFull` (exit 2) naming the filesystem, what the export needs there
and what is free.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from trainer.errors import ConfigError
from trainer.machine.disk import disk_cause, free_text, mount_point, why_refused

STAGING_PREFIX = ".tmp-export-"
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
WRITTEN_LAST = ("config.json", "adapter_config.json")  # what makes a folder loadable: moved up after the rest


class ExportDiskFull(ConfigError):
    """OUT's filesystem refused a write (full, over quota, read-only): exit 2, nothing published."""


def _staging_name(out: Path) -> str:
    return f"{STAGING_PREFIX}{out.resolve().name}"


def check(out: Path) -> None:
    """Exit 2 when OUT is a file, or a folder holding anything but a staging folder an earlier export left."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"export OUT={out}: a file is in the way; give a folder")
    if out.is_dir() and any(p.name != _staging_name(out) for p in out.iterdir()):
        raise ConfigError(f"export OUT={out}: the folder is not empty; give a new or empty folder as OUT (nothing "
                          "was overwritten)")  # fmt: skip


def staging(out: Path) -> Path:
    """The empty staging folder for OUT (module docstring: beside a new OUT, inside an existing empty one)."""
    folder = (out if out.is_dir() else out.parent) / _staging_name(out)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def publish(folder: Path, out: Path) -> None:
    """The staging folder becomes OUT (module docstring); anything else removes it, OUT left as it was."""
    if folder.parent != out:
        os.rename(folder, out)
        return
    names = sorted((p.name for p in folder.iterdir()), key=lambda name: (name in WRITTEN_LAST, name))
    try:
        for name in names:
            os.rename(folder / name, out / name)
        folder.rmdir()
    except BaseException:
        for name in names:
            moved = out / name
            if moved.is_dir() and not moved.is_symlink():
                shutil.rmtree(moved, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    moved.unlink()
        shutil.rmtree(folder, ignore_errors=True)
        raise


@contextlib.contextmanager
def removed_on_failure(folder: Path, out: Path, need: dict[str, int], passed: tuple[type, ...]) -> Iterator[None]:
    """Inside: any failure removes the staging folder; a full disk's (not one of `passed`, the export's own outcomes)
    becomes ExportDiskFull naming what `need` lists (bytes per part of the export)."""
    try:
        yield
    except BaseException as exc:
        cause = None if isinstance(exc, (ConfigError, *passed)) or not isinstance(exc, Exception) else disk_cause(
            exc, folder if folder.is_dir() else None)  # fmt: skip
        shutil.rmtree(folder, ignore_errors=True)
        if cause is None:
            raise
        raise ExportDiskFull(_full_message(out, folder.parent, cause, need)) from None


def _full_message(out: Path, where: Path, cause: OSError, need: dict[str, int]) -> str:
    parts = ", ".join(f"{what} {size / 2**20:.0f} MiB" for what, size in need.items())
    total = f"about {sum(need.values()) / 2**20:.0f} MiB there ({parts}). " if need else ""
    return (f"export {out}: the filesystem mounted at {mount_point(where)} {why_refused(cause)} ({cause.strerror}); "
            f"nothing was published and the staging folder is removed. The export needs {total}{free_text(where)}"
            "Free space there, or give an OUT on a larger filesystem")  # fmt: skip


def weights_size(folder: Path | str | None) -> tuple[int, int]:
    """(parameters, bytes) of a folder's *.safetensors, from their headers alone (0, 0 without any)."""
    import json
    import struct

    numel = size = 0
    for file in sorted(Path(folder).glob("*.safetensors")) if folder else []:
        with contextlib.suppress(OSError, ValueError, struct.error):
            with file.open("rb") as handle:
                header = json.loads(handle.read(struct.unpack("<Q", handle.read(8))[0]))
            for name, entry in header.items():
                if name != "__metadata__":
                    count = _product(entry["shape"])
                    numel += count
                    size += entry["data_offsets"][1] - entry["data_offsets"][0]
    return numel, size


def _product(shape: list[int]) -> int:
    count = 1
    for dim in shape:
        count *= int(dim)
    return count


def space_needed(weights: tuple[int, int], dtype_bytes: float, types: list[str]) -> dict[str, int]:
    """Bytes per part of an export of `weights` (parameters, bytes) in a dtype of `dtype_bytes` per parameter: its
    safetensors; with GGUF types the converter's file (the same dtype) and each type at its bits per weight (its
    format's block layout); each compressed-tensors folder at its own."""
    from trainer.export import compressed, gguf

    numel = weights[0]
    if not numel:
        return {}
    need = {"the export's weights": int(numel * dtype_bytes)}
    if any(kind in gguf.GGUF_TYPES for kind in types):
        need["llama.cpp's converted file"] = int(numel * dtype_bytes)
    bits = {**gguf.BITS_PER_WEIGHT, **compressed.BITS_PER_WEIGHT}
    for kind in types:
        need[kind] = int(numel * bits[kind] / 8)
    return need
