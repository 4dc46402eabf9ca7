"""Several sources in one TRAIN_DATA, each with a weight; several named sets in TRAIN_EVAL_DATA.

The parse rule (one definition, shown to users in docs/running.md):

- TRAIN_DATA is split at commas into sources. A source ends in `:WEIGHT` when the text after its last colon is a
  number (`0.7`, `3`, `1e-2`, `-1`); anything else stays part of the source, so `hf://datasets/org/name@rev/path`
  and `/data/a:b.jsonl` are sources without a weight. A path that itself ends in `:number` takes an explicit
  weight after it (`/data/run:2:1`); a path with a comma goes in a mix file.
- A value ending in `.mix.json` is a mix file: `{"sources": [{"path": ..., "weight": ..., "max_records": ...,
  "max_repeats": ..., "name": ...}]}` (weight required when there are several; the rest optional).
- TRAIN_EVAL_DATA is split at commas into eval sets, each `NAME=SOURCE` or a SOURCE named after its file or folder.

A weight is a share of the TRAINED tokens (tokens whose loss is taken: prompts and padding do not count). Each
source is prepared into its own cache entry (its own key; `max_records` is part of it), so changing a weight
re-tokenizes nothing: trainer.data.mixed draws the mix from the prepared shards. This module is the parse rule and
what the torch-free checks need; it imports no numpy.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.data.discovery import DataSource

MIX_SUFFIX = ".mix.json"
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?(inf|infinity|nan)", re.IGNORECASE)
_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_FILE_KEYS = {"path", "weight", "max_records", "max_repeats", "name"}


@dataclass(frozen=True)
class MixEntry:
    """One source of a mix: what TRAIN_DATA (or the mix file) says about it."""

    name: str
    source: str
    weight: float = 1.0
    max_records: int | None = None  # read at most this many records of it (part of its cache key)
    max_repeats: float | None = None  # repeat it at most this many times per epoch to meet its weight

    def describe(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass(frozen=True)
class Mix:
    """The parsed sources (empty: a plain single source) and what is wrong with the value."""

    entries: tuple[MixEntry, ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def is_mix(self) -> bool:
        """Several sources, or a mix file (also one that cannot be read: its problems are the mix's, never read as
        training data)."""
        return bool(self.entries or self.problems)

    def shares(self) -> dict[str, float]:
        """Each source's requested share of the trained tokens (weights normalized)."""
        total = sum(e.weight for e in self.entries)
        return {e.name: e.weight / total for e in self.entries}


# ---- parsing -------------------------------------------------------------------------------------------------------


def split_weight(part: str) -> tuple[str, str | None]:
    """(source, weight text or None): the weight is the text after the last colon when it is a number."""
    head, colon, tail = part.rpartition(":")
    if colon and head and _NUMBER.fullmatch(tail.strip()):
        return head.strip(), tail.strip()
    return part.strip(), None


def name_of(source: str) -> str:
    """A source's name in reports: its file's or folder's name without data suffixes (`chat` for chat.jsonl.gz)."""
    base = source.rstrip("/").rsplit("/", 1)[-1] or source
    base = base.split("@", 1)[0].replace("*", "_")
    while "." in base and base.rsplit(".", 1)[-1].lower() in {"jsonl", "json", "txt", "parquet", "arrow", "csv",
                                                             "gz", "zst", "bz2", "xz"}:  # fmt: skip
        base = base.rsplit(".", 1)[0]
    return re.sub(r"[^A-Za-z0-9_.-]", "_", base) or "source"


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}-{seen[name]}")
    return out


def parse_mix(value: str, variable: str = "TRAIN_DATA") -> Mix:
    """The sources of a TRAIN_DATA value (module docstring); a plain single source gives an empty Mix."""
    if value.strip().endswith(MIX_SUFFIX):
        return _mix_file(Path(value.strip()), variable)
    parts = value.split(",")
    if len(parts) == 1 and split_weight(value)[1] is None:
        return Mix()
    problems: list[str] = []
    pairs = [split_weight(p) for p in parts]
    if any(not source for source, _ in pairs):
        problems.append(f"{variable}={value}: an empty source (two commas in a row, or a comma at an end); list "
                        "each source once: SOURCE:WEIGHT,SOURCE:WEIGHT")  # fmt: skip
    pairs = [(s, w) for s, w in pairs if s]
    weighted = [s for s, w in pairs if w is not None]
    if len(pairs) > 1 and weighted and len(weighted) < len(pairs):
        missing = [s for s, w in pairs if w is None]
        problems.append(f"{variable}: weights given for {len(weighted)} of {len(pairs)} sources; add one to "
                        f"{', '.join(missing)} (SOURCE:WEIGHT; a weight is a share of the trained tokens)")  # fmt: skip
    entries = []
    for name, (source, text) in zip(_unique([name_of(s) for s, _ in pairs]), pairs, strict=True):
        weight = _weight(text, source, variable, problems)
        entries.append(MixEntry(name, source, weight))
    return Mix(tuple(entries), tuple(problems))


def _weight(text: Any, source: str, variable: str, problems: list[str]) -> float:
    if text is None:
        return 1.0
    try:
        weight = float(text)
    except (TypeError, ValueError):
        weight = math.nan
    if isinstance(text, bool) or not math.isfinite(weight) or weight <= 0:
        problems.append(f"{variable}: the weight {text!r} of {source} is not a positive number; give a number above "
                        "0 (weights are relative: 0.7 and 0.3, or 7 and 3)")  # fmt: skip
        return 1.0
    return weight


def _mix_file(path: Path, variable: str) -> Mix:
    where = f"{variable}={path}"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Mix((), (f"{where}: the mix file does not exist; create it or fix the path",))
    except (OSError, ValueError) as exc:
        return Mix((), (f"{where}: cannot read the mix file as JSON ({exc})",))
    sources = data.get("sources") if isinstance(data, dict) else None
    if not isinstance(sources, list) or not sources:
        return Mix((), (f"{where}: {_shape_problem(data)}; a mix file is {_SHAPE}",))
    problems: list[str] = []
    rows = [row if isinstance(row, dict) else {} for row in sources]
    for n, row in enumerate(rows, 1):
        unknown = sorted(set(row) - _FILE_KEYS)
        wrong = ([] if str(row.get("path", "")).strip() else ["needs a non-empty `path`"]) + (
            [f"has unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_FILE_KEYS))})"] if unknown else [])
        if wrong:
            problems.append(f"{where}: source {n} {'; '.join(wrong)}")
    if len(rows) > 1 and any("weight" not in row for row in rows) and any("weight" in row for row in rows):
        problems.append(f"{where}: weights given for some sources only; give every source a `weight`")
    names = _unique([str(row.get("name") or name_of(str(row.get("path", "")))) for row in rows])
    entries = []
    for name, row in zip(names, rows, strict=True):
        source = str(row.get("path", "")).strip()
        if not _NAME.fullmatch(name):
            problems.append(f"{where}: the name {name!r} of {source}: use letters, digits, '_', '-' or '.'")
        weight = _weight(row.get("weight"), source, variable, problems)
        entries.append(MixEntry(name, source, weight, _positive(row, "max_records", int, where, problems),
                                _positive(row, "max_repeats", float, where, problems)))  # fmt: skip
    return Mix(tuple(entries), tuple(problems))


_SHAPE = ('{"sources": [{"path": "/data/a.jsonl", "weight": 0.7}, ...]}, each source with the keys '
          + ", ".join(sorted(_FILE_KEYS)) + " (path required; weight when there are several)")


def _shape_problem(data: Any) -> str:
    """What is wrong with a mix file's top level (it has no non-empty `sources` list)."""
    if not isinstance(data, dict):
        return f"it holds a JSON {type(data).__name__}, not an object with a `sources` list"
    unknown = sorted(set(data) - {"sources"})
    if "sources" not in data:
        return "it has no `sources` key" + (f" (it has {', '.join(unknown)}; the one key is `sources`)" if unknown
                                            else "")  # fmt: skip
    return "its `sources` is empty" if data["sources"] == [] else "its `sources` is not a list"


def duplicate_sources(mix: Mix, parts: list[DataSource]) -> list[str]:
    """A file reached by two sources of the mix would be trained twice per epoch, each time as its own share:
    refused, naming both entries (to train a source more, raise its weight)."""
    seen: dict[Path, MixEntry] = {}
    problems = []
    for entry, part in zip(mix.entries, parts, strict=True):
        for file in part.identity_files():
            key = Path(file).resolve()
            first = seen.setdefault(key, entry)
            if first is not entry:
                problems.append(f"TRAIN_DATA: {file} is in the mix twice, in {first.name} ({first.source}) and in "
                                f"{entry.name} ({entry.source}); list each file once (to train it more, raise its "
                                "weight)")  # fmt: skip
                break
    return problems


def mix_file(value: str) -> list[Path]:
    """The mix file TRAIN_DATA names ([] for a plain source or a SOURCE:WEIGHT list): an input of the run, whose
    content (the weights) provenance records."""
    value = value.strip()
    return [Path(value)] if value.endswith(MIX_SUFFIX) and Path(value).is_file() else []


def _positive(row: dict[str, Any], key: str, kind: type, where: str, problems: list[str]) -> Any:
    value = row.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 or (kind is int and value % 1):
        problems.append(f"{where}: `{key}` of {row.get('path')} is {value!r}; give a positive "
                        f"{'whole number' if kind is int else 'number'} or leave it out")  # fmt: skip
        return None
    return kind(value)


def parse_eval_sets(value: str) -> list[tuple[str, str]]:
    """TRAIN_EVAL_DATA's sets as (name, source); one unnamed source gives [] (evaluated as plain `eval_loss`)."""
    parts = [p.strip() for p in value.split(",")]
    if len(parts) == 1 and not _named(parts[0])[0]:
        return []
    named = [_named(p) for p in parts]
    names = _unique([name or name_of(source) for name, source in named])
    return [(name, source) for name, (_, source) in zip(names, named, strict=True)]


def _named(part: str) -> tuple[str, str]:
    name, eq, source = part.partition("=")
    if eq and _NAME.fullmatch(name.strip()):
        return name.strip(), source.strip()
    return "", part


def eval_set_problems(value: str) -> list[str]:
    """What is wrong with a TRAIN_EVAL_DATA list: an empty set, a weight (eval sets are evaluated whole)."""
    problems = []
    for name, source in parse_eval_sets(value):
        if not source:
            problems.append(f"TRAIN_EVAL_DATA={value}: the eval set {name!r} names no source; give NAME=SOURCE")
        elif split_weight(source)[1] is not None:
            problems.append(f"TRAIN_EVAL_DATA: {source} has a weight; eval sets are evaluated whole, each reported "
                            "under its own name: drop the ':WEIGHT'")  # fmt: skip
    return problems


def eval_set_names(data: str, eval_data: str, eval_split: float) -> list[str]:
    """The names evaluation reports under (eval_<name>_loss): TRAIN_EVAL_DATA's sets, or with TRAIN_EVAL_SPLIT a
    mix's sources; [] for one eval set (plain eval_loss)."""
    if eval_data:
        return [name for name, _ in parse_eval_sets(eval_data)]
    return [e.name for e in parse_mix(data).entries] if eval_split > 0 else []


def identity(value: str) -> str:
    """TRAIN_DATA as a checkpoint records it: a mix file's content counts (a changed weight is a data change)."""
    if not value.strip().endswith(MIX_SUFFIX):
        return value
    mix = parse_mix(value)
    return json.dumps({"mix_file": value, "sources": [e.describe() for e in mix.entries]}, sort_keys=True)


def combined(value: str, mix: Mix, parts: list[DataSource]) -> DataSource:
    """One DataSource standing for the whole mix, for the checks, decisions and provenance: every part's files,
    layouts and problems (an empty part is a problem: in a mix nothing falls back to the embedded corpus)."""
    from trainer.data.discovery import DataSource

    problems = [*mix.problems, *duplicate_sources(mix, parts)]
    for entry, part in zip(mix.entries, parts, strict=True):
        problems += part.problems
        if not part.problems and (part.embedded or not part.identity_files()):
            problems.append(f"TRAIN_DATA: the source {entry.source} ({entry.name}) holds no data; fix its path or "
                            "leave it out of the mix")  # fmt: skip
    shares = ", ".join(f"{name} {100 * share:.4g}%" for name, share in mix.shares().items())
    files = tuple(dict.fromkeys(f for part in parts for f in part.identity_files()))
    layouts = tuple(dict.fromkeys(layout for part in parts for layout in part.layouts))
    return DataSource(value, files=files, problems=tuple(problems), layouts=layouts,
                      reason=f"a mix of {len(parts)} sources ({shares} of the trained tokens)")  # fmt: skip
