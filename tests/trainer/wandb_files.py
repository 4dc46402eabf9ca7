"""W&B's offline run files read back for the tests (trainer/trackers writes them through the wandb package)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

BLOCK = 32768


def log_payloads(path: Path) -> Iterator[bytes]:
    """The records of a .wandb file: W&B's LevelDB-style log (a 7-byte file header, 32 KiB blocks, each record a
    7-byte header: checksum, length, type FULL/FIRST/MIDDLE/LAST). wandb 0.31 reads it in its Go core only."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            yield pending


def wandb_records(run_dir: Path) -> list:
    """Every record of an offline run's .wandb file, decoded with the wandb package's own protobuf classes."""
    from wandb.proto import wandb_internal_pb2

    records = []
    for payload in log_payloads(next(run_dir.glob("*.wandb"))):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        records.append(record)
    return records
