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
re-tokenizes nothing: the mix is a list of (source, block) pairs drawn from the prepared shards with TRAIN_SEED.
An epoch of the mix holds as many trained tokens as the sources together; a source whose share is above its natural
share is repeated (whole passes, then a seeded sample of its blocks), one below it is sampled (a seeded subset of
its blocks, the same on every run with the same seed). Both are logged per source.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainer.data.packing import FLAG_START, FLAG_TRAINED
from trainer.errors import ConfigError

if TYPE_CHECKING:
    from trainer.data.dataset import BlockRange, ShardedDataset
    from trainer.data.discovery import DataSource

log = logging.getLogger("trainer")

MIX_SUFFIX = ".mix.json"
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?(inf|infinity|nan)", re.IGNORECASE)
_NAME = re.compile(r"[A-Za-z0-9_.-]+")
SHARE_TOLERANCE = 0.02  # an achieved share further than this from the requested one is a warning
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
        return bool(self.entries)

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
        return Mix((), (f'{where}: a mix file is {{"sources": [{{"path": "/data/a.jsonl", "weight": 0.7}}, ...]}}; '
                        "its `sources` list is missing or empty",))  # fmt: skip
    problems: list[str] = []
    rows = [row if isinstance(row, dict) else {} for row in sources]
    for n, row in enumerate(rows, 1):
        unknown = sorted(set(row) - _FILE_KEYS)
        if unknown or not str(row.get("path", "")).strip():
            problems.append(f"{where}: source {n} needs a non-empty `path`" + (
                f"; unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_FILE_KEYS))})" if unknown else ""))
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

    problems = list(mix.problems)
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


# ---- mixing the prepared sources -----------------------------------------------------------------------------------


def trained_per_block(dataset: ShardedDataset) -> np.ndarray:
    """Trained tokens (labels not -100) of each block, read from the mask shards a chunk at a time."""
    counts = np.full(len(dataset), dataset.seq_len, np.int64)
    if dataset.meta["has_mask"]:
        seq, chunk = dataset.seq_len, max(1, (1 << 24) // dataset.seq_len)
        for shard, blocks in enumerate(dataset.meta["blocks"]):
            flags = dataset._map("mask", shard)
            for first in range(0, blocks, chunk):
                part = np.asarray(flags[first * seq : min(blocks, first + chunk) * seq]).reshape(-1, seq)
                trained = (part & FLAG_TRAINED) != 0
                if dataset.records:
                    trained &= (part & FLAG_START) == 0
                counts[dataset.starts[shard] + first : dataset.starts[shard] + first + len(part)] = trained.sum(1)
    if dataset.meta["pad_from"] is not None:
        counts[:] = np.minimum(counts, dataset.meta["pad_from"])
    return counts


class MixedDataset:
    """The blocks a mix draws, in a seeded order: item k is block `blocks[k]` of source `sources[k]`."""

    def __init__(self, parts: list[Any], sources: np.ndarray, blocks: np.ndarray, report: dict[str, Any]) -> None:
        self.parts, self.sources, self.blocks, self.report = parts, sources, blocks, report
        self.seq_len = parts[0].seq_len
        self.meta = {**parts[0].meta, "mix": report}
        # every item carries the keys any source's items carry, so the collator can stack a batch of several sources
        self.positions = any(p.meta.get("packing", {}).get("record_blocks") for p in parts)
        self.padded = any(p.meta["pad_from"] is not None for p in parts)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not 0 <= i < len(self):
            raise IndexError(i)
        item = self.parts[int(self.sources[i])][int(self.blocks[i])]
        if self.positions and "position_ids" not in item:  # a stream block is one segment: 0..seq_len-1
            item["position_ids"] = _torch().arange(self.seq_len)
        if self.padded and "attention_mask" not in item:
            item["attention_mask"] = _torch().ones(self.seq_len, dtype=_torch().int64)
        return item


def _torch() -> Any:
    import torch

    return torch


def plan(entries: list[MixEntry], parts: list[ShardedDataset | BlockRange], counts: list[np.ndarray], seed: int
         ) -> MixedDataset:  # fmt: skip
    """The mix of the prepared `parts` (their trained tokens per block in `counts`) at the entries' weights;
    ConfigError when a source cannot reach its share."""
    total_weight = sum(e.weight for e in entries)
    natural = sum(int(c.sum()) for c in counts)
    rng = np.random.default_rng(seed)
    chosen, problems = [], []
    for entry, count in zip(entries, counts, strict=True):
        share = entry.weight / total_weight
        per_block = count.mean() if len(count) else 0.0
        take = round(share * natural / per_block) if per_block else 0
        repeats = take / max(1, len(count))
        if take < 1:
            problems.append(f"TRAIN_DATA: {entry.name} ({entry.source}) cannot reach its share {100 * share:.3g}%: "
                            f"it has {int(count.sum())} trained tokens in {len(count)} sequences and the mix would "
                            "take none; give it a larger weight or more data")  # fmt: skip
        elif entry.max_repeats is not None and repeats > entry.max_repeats:
            problems.append(f"TRAIN_DATA: {entry.name} ({entry.source}) needs {repeats:.2f} repeats to reach its share "
                            f"{100 * share:.3g}%, above its max_repeats {entry.max_repeats:g}; lower its weight, raise "
                            "max_repeats or max_records, or add data")  # fmt: skip
        chosen.append(_draw(len(count), take, rng))
    if problems:
        raise ConfigError(*problems)
    sources = np.concatenate([np.full(len(c), i, np.int32) for i, c in enumerate(chosen)])
    blocks = np.concatenate(chosen)
    order = rng.permutation(len(blocks))
    achieved = [int(count[c].sum()) for count, c in zip(counts, chosen, strict=True)]
    report = _report(entries, counts, chosen, achieved, seed)
    return MixedDataset(list(parts), sources[order], blocks[order], report)


def _draw(blocks: int, take: int, rng: np.random.Generator) -> np.ndarray:
    """`take` block indices out of `blocks`: whole passes, then a seeded sample without replacement."""
    if blocks == 0:
        return np.zeros(0, np.int64)
    whole, rest = divmod(take, blocks)
    return np.concatenate([np.tile(np.arange(blocks), whole), np.sort(rng.choice(blocks, rest, replace=False))])


def _report(entries: list[MixEntry], counts: list[np.ndarray], chosen: list[np.ndarray], achieved: list[int],
            seed: int) -> dict[str, Any]:  # fmt: skip
    total_weight, total = sum(e.weight for e in entries), max(1, sum(achieved))
    rows = []
    for entry, count, c, trained in zip(entries, counts, chosen, achieved, strict=True):
        rows.append({**entry.describe(), "requested_share": round(entry.weight / total_weight, 6),
                     "achieved_share": round(trained / total, 6), "sequences": len(count), "sequences_used": len(c),
                     "repeats": round(len(c) / max(1, len(count)), 4), "trained_tokens": trained})  # fmt: skip
    return {"seed": seed, "sequences": sum(len(c) for c in chosen), "trained_tokens": sum(achieved), "sources": rows}


def log_report(report: dict[str, Any]) -> None:
    """One log line per source: requested and achieved share, and how it got there (repeated, sampled)."""
    for row in report["sources"]:
        how = (f"repeated {row['repeats']:.2f} times" if row["repeats"] > 1
               else f"sampled {100 * row['repeats']:.1f}% of its sequences" if row["repeats"] < 1 else "used once")
        log.info("data mix: %s (%s): requested %.2f%%, achieved %.2f%% of %d trained tokens; %d sequences drawn from "
                 "its %d, %s%s",
                 row["name"], row["source"], 100 * row["requested_share"], 100 * row["achieved_share"],
                 report["trained_tokens"], row["sequences_used"], row["sequences"], how,
                 f"; capped at its first {row['max_records']} records" if row.get("max_records") else "")  # fmt: skip
        if abs(row["achieved_share"] - row["requested_share"]) > SHARE_TOLERANCE:
            log.warning("data mix: %s reaches %.2f%% instead of %.2f%% (its sequences are few or uneven); more data "
                        "brings it closer", row["name"], 100 * row["achieved_share"], 100 * row["requested_share"])


def prepare_mix(mix: Mix, parts: list[DataSource], tokenizer: Any, spec: Any, cache_dir: Path, seed: int,
                held_fraction: float = 0.0, should_stop: Any = None
                ) -> tuple[MixedDataset, dict[str, BlockRange]]:  # fmt: skip
    """(the mixed training data, each source's held-out blocks by name when `held_fraction` > 0): every source
    from its own cache entry (prepared here when missing), then mixed at its weight with `seed`."""
    from trainer.data import cache
    from trainer.data.dataset import hold_out, load_or_prepare

    trains: list[Any] = []
    counts, held = [], {}
    for entry, part in zip(mix.entries, parts, strict=True):
        log.info("data mix: source %s (%s)", entry.name, entry.source)
        dataset = load_or_prepare(part, tokenizer, dataclasses.replace(spec, max_records=entry.max_records),
                                  cache_dir, should_stop or cache.never)  # fmt: skip
        count = trained_per_block(dataset)
        train: Any = dataset
        if held_fraction > 0:
            train, held[entry.name] = hold_out(dataset, held_fraction)
            count = count[: len(train)]
        trains.append(train)
        counts.append(count)
    mixed = plan(list(mix.entries), trains, counts, seed)
    log_report(mixed.report)
    return mixed, held
