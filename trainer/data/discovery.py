"""Which files TRAIN_DATA names, and what is wrong with them: the one definition of data discovery.

`discover(spec, text_field)` scans once and returns a `DataSource` holding the files, the decision shown by
`python -m trainer config`, and every problem found; `scan` does it for TRAIN_DATA or TRAIN_EVAL_DATA, a Hub dataset
included. The torch-free checks (`trainer.config`), doctor and the training run all read the same scan: the run's
`trainer.config.inputs.Inputs` makes it on first use and travels from the checks to `resolve` and on to the run.

Rules: files are picked by suffix (see `formats.file_kind`), hidden files are skipped, empty files hold no data,
and a dangling symlink or an unreadable file is a problem that names the file (never skipped in silence).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.data.formats import (
    MAX_LINE_BYTES,
    SUPPORTED,
    bad_line_message,
    decode_errors,
    file_kind,
    is_glob,
    long_line_message,
    open_text,
    too_many_bad_lines,
)  # fmt: skip

if TYPE_CHECKING:
    from trainer.data.spec import DataSpec
    from trainer.hub.sources import HubSources

DEFAULT_DATA = "/data"
EMBEDDED_CORPUS = Path(__file__).resolve().parents[1] / "assets" / "corpus.txt"
SAVED_DATASET_MARKERS = ("dataset_info.json", "dataset_dict.json", "state.json")
MAX_FILES_CHECKED = 1000  # beyond this, the reader reports problems as it meets them
SPLITS = ("train", "validation", "valid", "dev", "test", "eval")
EVAL_SPLITS = ("validation", "valid", "dev", "eval", "test")  # the first one a folder has is the evaluation data


@dataclass(frozen=True)
class DataSource:
    """The result of one scan of TRAIN_DATA."""

    spec: str
    files: tuple[Path, ...] = ()
    saved_dataset: Path | None = None
    embedded: bool = False
    left_out: tuple[Path, ...] = ()  # files of other splits in a hub-style folder
    problems: tuple[str, ...] = ()
    reason: str = ""
    variable: str = "TRAIN_DATA"  # the setting it came from, named in every message about it
    layouts: tuple[str, ...] = ()  # the record layouts of its files (chat.LAYOUT_NAMES), each once

    @property
    def conversational(self) -> bool:
        from trainer.data.chat import CHAT_LAYOUTS

        return any(layout in CHAT_LAYOUTS for layout in self.layouts)

    def layout_names(self) -> str:
        """The detected record formats, as `config` and `doctor` show them."""
        from trainer.data.chat import LAYOUT_NAMES
        from trainer.data.vision import IMAGE_LAYOUT_NAMES

        names = {**LAYOUT_NAMES, **IMAGE_LAYOUT_NAMES}
        return ", ".join(names.get(layout, layout) for layout in self.layouts) or "unknown"

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        if self.embedded:
            return "the embedded default corpus"
        if self.saved_dataset:
            return f"datasets.save_to_disk folder {self.saved_dataset}"
        text = f"{len(self.files)} file(s)" + (f" ({self.files[0]})" if len(self.files) == 1 else "")
        if self.left_out:
            text += f"; {len(self.left_out)} file(s) of other splits left out"
        return text

    def decision(self) -> dict[str, Any]:
        """{value, reason} for the `data` decision; empty when the data cannot be used."""
        if self.problems and not (self.files or self.saved_dataset):
            return {}
        value = "embedded" if self.embedded else str(self.saved_dataset or self.spec)
        return {"value": value, "reason": self.reason}

    def identity_files(self) -> list[Path]:
        """The files whose identity (path, size, mtime) keys the tokenized cache."""
        if self.saved_dataset:
            return sorted(p for p in self.saved_dataset.rglob("*") if p.is_file())
        return list(self.files)


def scan(key: str, value: str, spec: DataSpec, hub: HubSources) -> DataSource:
    """The scan of TRAIN_DATA (`key` "data") or TRAIN_EVAL_DATA ("eval_data", a hub-style folder gives its validation
    split), or of one source of its list (`key` "data:chat", trainer.hub.sources.entry_key), set to `value`: a Hub
    dataset's snapshot (already fetched into `hub` under `key`) or local data. Its problems name the setting."""
    from trainer.hub.sources import setting_of

    setting = setting_of(key)
    split = "train" if setting == "data" else "eval"
    source = _hub_scan(key, value, spec, hub, split) or discover(value, spec.text_field, spec.max_bad_lines, split)
    if setting == "eval_data":  # discover's messages name TRAIN_DATA
        renamed = tuple("TRAIN_EVAL_DATA" + p[len("TRAIN_DATA") :] if p.startswith(("TRAIN_DATA=", "TRAIN_DATA:"))
                        else p for p in source.problems)  # fmt: skip
        source = dataclasses.replace(source, problems=renamed, variable="TRAIN_EVAL_DATA")
    return source


def _hub_scan(key: str, value: str, spec: DataSpec, hub: HubSources, split: str) -> DataSource | None:
    """The scan of a Hub dataset's snapshot; None for local data."""
    from trainer.data.hub_datasets import describe, local_data_spec
    from trainer.hub.ids import parse_dataset_id

    if parse_dataset_id(value) is None:
        return None
    snap = hub.snapshot(key)
    if snap is None:
        return DataSource(value, problems=tuple(hub.problems_of.get(key, ())))
    found = discover(local_data_spec(snap.path, snap.ref), spec.text_field, spec.max_bad_lines, split)
    return dataclasses.replace(found, spec=value, reason=f"{describe(snap)}: {found.reason}")


def discover(spec: str, text_field: str = "text", max_bad_lines: int = 0, split: str = "train") -> DataSource:
    """Scan TRAIN_DATA: a file, a folder (plain, hub-style or save_to_disk) or a glob. Never raises.

    In a hub-style folder `split` picks the files: "train", or "eval" for the first of EVAL_SPLITS it has."""
    path = Path(spec)
    if path.is_dir() and _is_saved_dataset(path):
        layouts = _layouts((path,), text_field)
        return DataSource(spec, saved_dataset=path, reason="a datasets.save_to_disk folder", layouts=layouts)
    special = None if is_glob(spec) else _special_file(path)
    if special:
        return DataSource(spec, problems=(f"TRAIN_DATA={spec}: {special}, not a data file; the data is read more "
                                          "than once (scanned, then tokenized): write it to a file and give that",))
    if not is_glob(spec) and (path.is_file() or path.is_symlink()) and file_kind(path) is None:
        return DataSource(spec, problems=(f"TRAIN_DATA={spec}: unsupported file type; use one of {SUPPORTED}",))
    candidates, exists = _candidates(spec)
    candidates, repeated = _each_file_once(candidates)
    files, left_out, chosen = _pick_split(candidates, path if path.is_dir() else None, split)
    non_empty = tuple(p for p in files if not p.exists() or p.stat().st_size > 0)
    if not non_empty:
        return _no_data(spec, exists, bool(files))
    reason = f"{len(non_empty)} data file(s)" + (f", split {chosen!r} ({len(left_out)} other-split files left out)"
                                                  if left_out else "")  # fmt: skip
    if repeated:
        reason += f"; {repeated} more path(s) lead to these same files (symlinks) and are read once"
    problems = tuple(_file_problems(non_empty, text_field, max_bad_lines))
    layouts = _layouts(non_empty, text_field) if not problems else ()
    return DataSource(spec, files=non_empty, left_out=left_out, problems=problems, reason=reason, layouts=layouts)


def _layouts(files: tuple[Path, ...], text_field: str) -> tuple[str, ...]:
    """The record layouts of the first MAX_FILES_CHECKED files (vision.file_image_layout, else chat.file_layout),
    each once, in order."""
    from trainer.data.chat import file_layout
    from trainer.data.vision import file_image_layout

    found = (file_image_layout(p) or file_layout(p, text_field) for p in files[:MAX_FILES_CHECKED])
    return tuple(dict.fromkeys(layout or "text" for layout in found))


def _is_saved_dataset(folder: Path) -> bool:
    return any((folder / name).exists() for name in SAVED_DATASET_MARKERS)


def _candidates(spec: str) -> tuple[list[Path], bool]:
    """(data files by suffix, whether the spec names anything). Dangling symlinks are kept: they are reported."""
    path = Path(spec)
    if is_glob(spec):
        matches = [Path(p) for p in glob.glob(spec, recursive=True)]
    elif path.is_dir():
        matches = list(path.rglob("*"))
    elif path.is_file() or path.is_symlink():
        return [path], True
    else:
        return [], False
    root = path if path.is_dir() else None
    data = [p for p in matches if file_kind(p) is not None and not _hidden(p, root)]
    files = [p for p in data if p.is_file() or p.is_symlink()]
    return sorted(files), bool(matches) or path.is_dir()


def _each_file_once(paths: list[Path]) -> tuple[list[Path], int]:
    """The first path to each real file (a symlink loop under `**` reaches one file by many paths); and how many
    paths were repeats."""
    seen: set[str] = set()
    kept = []
    for p in paths:
        real = os.path.realpath(p)
        if real not in seen:
            seen.add(real)
            kept.append(p)
    return kept, len(paths) - len(kept)


def _hidden(path: Path, root: Path | None) -> bool:
    """A hidden file, or a file in a hidden folder under TRAIN_DATA (.cache, .git, ...)."""
    parts = path.relative_to(root).parts if root else (path.name,)
    return any(part.startswith(".") for part in parts)


def _split_of(path: Path, root: Path | None) -> str | None:
    """The hub-style split a file belongs to: `train-00000-of-00002.parquet`, `train.jsonl` or `train/...`."""
    parts = path.relative_to(root).parts if root else (path.name,)
    for split in SPLITS:
        if any(part == split for part in parts[:-1]):
            return split
        name = parts[-1].lower()
        if name.startswith(split) and (len(name) == len(split) or name[len(split)] in "-_."):
            return split
    return None


def _pick_split(
    files: list[Path], root: Path | None, split: str = "train"
) -> tuple[list[Path], tuple[Path, ...], str]:
    """In a hub-style folder (files named by split), the files of `split` ("eval": the first of EVAL_SPLITS there);
    the others are named as left out. Returns (files, left out, the split chosen)."""
    if root is None:
        return files, (), split
    splits = {p: _split_of(p, root) for p in files}
    present = set(splits.values())
    wanted = next((s for s in EVAL_SPLITS if s in present), split) if split == "eval" else split
    if wanted not in present or present == {wanted}:
        return files, (), wanted
    return ([p for p in files if splits[p] == wanted], tuple(p for p in files if splits[p] not in (wanted, None)),
            wanted)  # fmt: skip


def _special_file(path: Path) -> str | None:
    """What `path` is when it exists but is neither a file nor a folder (a FIFO, a socket, a device); else None."""
    import stat

    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    return "a socket" if stat.S_ISSOCK(mode) else "a device"


def _no_data(spec: str, exists: bool, has_files: bool) -> DataSource:
    if spec.rstrip("/") == DEFAULT_DATA:
        why = "does not exist" if not exists else "holds no data files"
        reason = f"{spec} {why}: training on the small embedded corpus"
        return DataSource(spec, files=(EMBEDDED_CORPUS,), embedded=True, reason=reason)
    if not exists:
        return DataSource(spec, problems=(f"TRAIN_DATA={spec}: no such file or folder; mount your data there or fix "
                                          "the path",))  # fmt: skip
    what = "its files are empty" if has_files else f"no {SUPPORTED} files"
    return DataSource(spec, problems=(f"TRAIN_DATA={spec}: no data found ({what}); point it at a file, folder or "
                                      "glob with data",))  # fmt: skip


# ---- per-file checks (the first MAX_FILES_CHECKED files; the reader reports the rest as it meets them) ----------


def _file_problems(files: tuple[Path, ...], text_field: str, max_bad_lines: int) -> list[str]:
    problems = []
    for path in files[:MAX_FILES_CHECKED]:
        kind = file_kind(path)
        try:
            if kind and kind.format in ("jsonl", "json"):
                problems.append(_jsonl_problem(path, text_field, max_bad_lines))
            elif kind and kind.format == "csv":
                problems.append(_csv_problem(path, text_field))
            else:
                with path.open("rb") as handle:
                    handle.read(1)
        except decode_errors() as exc:
            problems.append(_unreadable(path, exc))
    return [p for p in problems if p]


def _unreadable(path: Path, exc: BaseException) -> str:
    if path.is_symlink() and not path.exists():
        reason = "dangling symlink"
    elif isinstance(exc, PermissionError):
        reason = "permission denied"
    else:
        reason = f"{getattr(exc, 'strerror', None) or exc}"
    return f"TRAIN_DATA: cannot read {path} ({reason}); fix the file or its permissions"


def _jsonl_problem(path: Path, text_field: str, max_bad_lines: int) -> str | None:
    """The first record: is it JSON, and does it hold the text field? (The reader checks every other record.)"""
    first = _first_record(path)
    if first is None:
        return None
    kind = file_kind(path)
    one_document = kind is not None and kind.format == "json"  # a .json file, where a JSON Lines one has records
    if len(first[1]) > MAX_LINE_BYTES:  # read no further: a .json document may be one long line, the reader's to read
        return None if one_document else long_line_message(path, first[0])
    try:
        row = json.loads(first[1])
    except json.JSONDecodeError as exc:
        if one_document or max_bad_lines > 0:
            return None  # a .json document spans lines; skipped lines are the reader's to count
        return too_many_bad_lines(bad_line_message(path, first[0], f"not valid JSON ({exc.msg})"), 1, 0)
    from trainer.data.chat import CHAT_LAYOUTS, BadRecord, conversation_of, layout_of_record
    from trainer.data.vision import first_record_problem
    from trainer.data.vision import layout_of_record as image_layout

    if isinstance(row, dict) and image_layout(row):  # its images are read by the run, before the model loads
        problem = first_record_problem(path, row, first[0]) if max_bad_lines == 0 else None
        return too_many_bad_lines(problem, 1, 0) if problem else None
    layout = layout_of_record(row, text_field) if isinstance(row, dict) else None
    if layout in CHAT_LAYOUTS and max_bad_lines == 0:
        try:
            conversation_of(row, layout, f"{path}:{first[0]}")
        except BadRecord as exc:
            return too_many_bad_lines(bad_line_message(path, first[0], str(exc)), 1, 0)
    if not isinstance(row, dict) or layout is not None:
        return None
    fields = ", ".join(sorted(row)[:8])
    return (
        f"TRAIN_DATA: {path}: records have no field {text_field!r} (they have: {fields}); set TRAIN_TEXT_FIELD, "
        "or use prompt/completion, messages or conversations records"
    )


def _first_record(path: Path) -> tuple[int, str] | None:
    """(line number, text) of the first non-blank line, reading at most MAX_LINE_BYTES + 1 characters of it."""
    with open_text(path) as handle:
        for number in range(1, 1 << 20):
            line = handle.readline(MAX_LINE_BYTES + 1)
            if not line:
                return None
            if line.strip() or len(line) > MAX_LINE_BYTES:
                return number, line
    return None


def _csv_problem(path: Path, text_field: str) -> str | None:
    import csv

    with open_text(path) as handle:
        header = next(csv.reader(handle), [])
    if header and text_field not in header and not {"prompt", "completion"} <= set(header):
        return f"TRAIN_DATA: {path}: no column {text_field!r} (columns: {', '.join(header[:8])}); set TRAIN_TEXT_FIELD"
    return None
