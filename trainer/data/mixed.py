"""The mix of prepared sources (trainer.data.mix parses it): a list of (source, block) pairs drawn with TRAIN_SEED.

An epoch of the mix holds as many trained tokens as the sources together; a source whose share is above its natural
share is repeated (whole passes, then a seeded sample of its blocks), one below it is sampled (a seeded subset of
its blocks, the same on every run with the same seed). Both are logged per source, with the requested and achieved
share of the trained tokens.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainer.data.mix import Mix, MixEntry
from trainer.data.packing import FLAG_START, FLAG_TRAINED
from trainer.data.prompts import PromptRecords
from trainer.errors import ConfigError

if TYPE_CHECKING:
    from trainer.data.dataset import BlockRange, ShardedDataset
    from trainer.data.discovery import DataSource

log = logging.getLogger("trainer")

SHARE_TOLERANCE = 0.02  # an achieved share further than this from the requested one is a warning


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


TOKENS = ("trained tokens", "sequences")  # what an SFT mix shares and draws
PROMPTS = ("prompts", "records")  # what an online RL mix shares and draws (trainer.data.prompts)


def plan(entries: list[MixEntry], parts: list[ShardedDataset | BlockRange], counts: list[np.ndarray], seed: int
         ) -> MixedDataset:  # fmt: skip
    """The mix of the prepared `parts` (their trained tokens per block in `counts`) at the entries' weights;
    ConfigError when a source cannot reach its share."""
    sources, blocks, report = draw(entries, counts, seed)
    return MixedDataset(list(parts), sources, blocks, report)


def draw(entries: list[MixEntry], counts: list[np.ndarray], seed: int, units: tuple[str, str] = TOKENS
         ) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:  # fmt: skip
    """(each drawn item's source, its index in that source, the report) in a seeded order: every source's share of
    the units counted per item (`counts`) at its weight; ConfigError when a source cannot reach its share."""
    unit, items = units
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
                            f"it has {int(count.sum())} {unit} in {len(count)} {items} and the mix would "
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
    return sources[order], blocks[order], _report(entries, counts, chosen, achieved, seed)


def training_prompts(records: PromptRecords, entries: list[MixEntry], seed: int
                     ) -> tuple[PromptRecords, dict[str, Any] | None]:  # fmt: skip
    """Online RL's prompts as a run trains on them: a mix (records.parts) drawn by share of the prompts with
    TRAIN_SEED, logged per source (the report, None for one source); one source as read."""
    if not records.parts:
        return records, None
    starts = np.cumsum([0, *records.parts])
    sources, indices, report = draw(entries, [np.ones(n, np.int64) for n in records.parts], seed, PROMPTS)
    rows = [int(starts[s] + i) for s, i in zip(sources, indices, strict=True)]
    drawn = PromptRecords(rows=[records.rows[r] for r in rows], wheres=[records.wheres[r] for r in rows],
                          skipped=records.skipped, problems=records.problems)  # fmt: skip
    log_report(report, PROMPTS)
    names = {"sequences": "records", "sequences_used": "records_used", "trained_tokens": "prompts"}
    per_source = [{names.get(k, k): v for k, v in row.items()} for row in report["sources"]]
    return drawn, {**{names.get(k, k): v for k, v in report.items()}, "sources": per_source}


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


def log_report(report: dict[str, Any], units: tuple[str, str] = TOKENS) -> None:
    """One log line per source: requested and achieved share, and how it got there (repeated, sampled)."""
    unit, items = units
    for row in report["sources"]:
        how = (f"repeated {row['repeats']:.2f} times" if row["repeats"] > 1
               else f"sampled {100 * row['repeats']:.1f}% of its {items}" if row["repeats"] < 1 else "used once")
        log.info("data mix: %s (%s): requested %.2f%%, achieved %.2f%% of %d %s; %d %s drawn from its %d, %s%s",
                 row["name"], row["source"], 100 * row["requested_share"], 100 * row["achieved_share"],
                 report["trained_tokens"], unit, row["sequences_used"], items, row["sequences"], how,
                 f"; capped at its first {row['max_records']} records" if row.get("max_records") else "")  # fmt: skip
        if abs(row["achieved_share"] - row["requested_share"]) > SHARE_TOLERANCE:
            log.warning("data mix: %s reaches %.2f%% instead of %.2f%% (its %s are few or uneven); more data "
                        "brings it closer", row["name"], 100 * row["achieved_share"], 100 * row["requested_share"],
                        items)  # fmt: skip


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
