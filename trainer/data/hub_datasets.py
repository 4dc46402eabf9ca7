"""TRAIN_DATA / TRAIN_EVAL_DATA given as Hub datasets: `hf://datasets/org/name[@revision][/path]`.

Only the data files are downloaded into HF_HOME's cache: those under `path` (a config folder such as `en/`), the
file or glob `path` names (`en/validation-*.parquet`), or every data file of the repository (`DATA_FILES`, which
the configuration hands to trainer.hub.sources.resolve_hub). The snapshot is then an ordinary local folder for
discovery: a hub-style layout gives its train split to TRAIN_DATA and its validation split to TRAIN_EVAL_DATA, and
the reader streams the files into the same prepared-shard cache as local data.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trainer.data.formats import COMPRESSIBLE, COMPRESSIONS, FORMATS, is_glob
from trainer.hub.ids import HubRef
from trainer.hub.sources import DatasetFiles

if TYPE_CHECKING:
    from trainer.hub.download import Snapshot


def data_patterns(ref: HubRef) -> tuple[str, ...]:
    """The allow_patterns of a dataset snapshot: the data files under ref.path, or the file or glob it names."""
    suffixes = [*FORMATS, *(s + c for s, f in FORMATS.items() if f in COMPRESSIBLE for c in COMPRESSIONS)]
    if is_glob(ref.path):
        return (ref.path,)
    prefix = f"{ref.path}/" if ref.path else ""
    return tuple([ref.path] if ref.path else []) + tuple(f"{prefix}*{suffix}" for suffix in suffixes)


def local_data_spec(snapshot_path: Path, ref: HubRef) -> str:
    """What trainer.data scans for the snapshot: its folder, or the file, folder or glob ref.path names in it."""
    return str(snapshot_path / ref.path) if ref.path else str(snapshot_path)


def no_files_problem(variable: str, snapshot_path: Path, ref: HubRef, sha: str) -> str | None:
    """A problem when the snapshot holds no data file for ref (a wrong path, or a repository of scripts)."""
    import glob

    spec = local_data_spec(snapshot_path, ref)
    found = glob.glob(spec) if is_glob(ref.path) else [spec] if Path(spec).exists() else []
    if found:
        return None
    where = f"at {ref.path!r}" if ref.path else "in the repository"
    return (f"{variable}={ref}: no data files {where} (commit {sha}); data files are {', '.join(FORMATS)}: add the "
            "config folder or file to the ID, e.g. hf://datasets/org/name/en or .../en/train-*.parquet")  # fmt: skip


def describe(snapshot: Snapshot) -> str:
    return f"Hub dataset {snapshot.ref.repo_id} at commit {snapshot.sha}"


DATA_FILES = DatasetFiles(patterns=data_patterns, missing=no_files_problem)
