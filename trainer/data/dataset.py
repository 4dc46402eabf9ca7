"""The map-style dataset over the token shards, and `load_or_prepare`, the training run's one call into the data.

Each item is one block of `seq_len` tokens read from a memory-mapped shard, so no process holds the corpus:
pages are read on demand and shared by every rank and DataLoader worker on the node.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainer.data import cache
from trainer.data.discovery import EMBEDDED_CORPUS, DataSource
from trainer.data.packing import FLAG_START, FLAG_TRAINED, report_left_out
from trainer.data.packing import describe as describe_packing
from trainer.data.spec import DataSpec
from trainer.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger("trainer")

IGNORE_INDEX = -100


class ShardedDataset:
    """Blocks of token ids from the shards; labels are the ids, with -100 where the loss is not taken (prompts,
    padding, each record's first token). Where records were packed whole, items carry `position_ids` restarting at
    0 on each record: with them (and use_cache off) attention stays inside each record (trainer.model.packed_attention).
    """

    def __init__(self, folder: Path, meta: dict[str, Any]) -> None:
        self.folder, self.meta = folder, meta
        self.seq_len = int(meta["seq_len"])
        self.starts = np.cumsum([0, *meta["blocks"]]).tolist()
        self.records = bool(meta.get("packing", {}).get("record_blocks"))
        self._maps: dict[tuple[str, int], np.ndarray] = {}

    def __len__(self) -> int:
        return self.starts[-1]

    def __getstate__(self) -> dict[str, Any]:  # DataLoader workers map the shards themselves
        return {**self.__dict__, "_maps": {}}

    def _map(self, kind: str, shard: int) -> np.ndarray:
        if (kind, shard) not in self._maps:
            dtype = self.meta["dtype"] if kind == "tokens" else np.uint8
            self._maps[kind, shard] = np.memmap(self.folder / f"{kind}-{shard:05d}.bin", dtype=dtype, mode="r")
        return self._maps[kind, shard]

    def arrays(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(ids, labels, position_ids or None) of block i as int64 arrays."""
        if not 0 <= i < len(self):
            raise IndexError(i)
        shard = bisect.bisect_right(self.starts, i) - 1
        span = slice((i - self.starts[shard]) * self.seq_len, (i - self.starts[shard] + 1) * self.seq_len)
        ids = np.asarray(self._map("tokens", shard)[span], dtype=np.int64)
        labels, positions = ids.copy(), None
        if self.meta["has_mask"]:
            flags = self._map("mask", shard)[span]
            labels[(flags & FLAG_TRAINED) == 0] = IGNORE_INDEX
            if self.records:
                starts = (flags & FLAG_START) != 0
                labels[starts] = IGNORE_INDEX  # the previous record's last token never predicts this one
                positions = positions_of(starts)
        if self.meta["pad_from"] is not None:
            labels[self.meta["pad_from"] :] = IGNORE_INDEX
        return ids, labels, positions

    def block(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids, labels) of block i as int64 arrays."""
        ids, labels, _ = self.arrays(i)
        return ids, labels

    def __getitem__(self, i: int) -> dict[str, Any]:
        import torch

        ids, labels, positions = self.arrays(i)
        item = {"input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(labels)}
        if positions is not None:
            item["position_ids"] = torch.from_numpy(positions)
        if self.meta["pad_from"] is not None:
            mask = np.zeros(self.seq_len, dtype=np.int64)
            mask[: self.meta["pad_from"]] = 1
            item["attention_mask"] = torch.from_numpy(mask)
        return item


def positions_of(starts: np.ndarray) -> np.ndarray:
    """Position ids that restart at 0 on every True of `starts` (a record's first token)."""
    index = np.arange(len(starts), dtype=np.int64)
    return index - np.maximum.accumulate(np.where(starts, index, 0))


def load_or_prepare(source: DataSource, tokenizer: PreTrainedTokenizerBase, spec: DataSpec, cache_dir: Path,
                    should_stop: Callable[[], bool] = cache.never) -> ShardedDataset:  # fmt: skip
    """The source's shards, as `spec` says, from the cache (made here, or by local rank 0, when the cache does not
    have them); the scan's problems are a ConfigError. The run's one call into the data, for training and for
    evaluation data alike.

    `should_stop()` True (a SIGTERM arrived) ends the preparation or the wait with `cache.Stopped`."""
    from trainer.data.shards import prepare

    if source.problems:
        raise ConfigError(*source.problems)
    if source.embedded:
        log.warning("data: %s is missing or empty: training on the small EMBEDDED DEFAULT CORPUS (%s); mount your data "
                    "at /data or set TRAIN_DATA", source.spec, EMBEDDED_CORPUS.name)  # fmt: skip
    else:
        log.info("data: %s", source.describe())
    key = cache.cache_key(source, tokenizer, spec)
    meta = cache.read_meta(cache_dir / key)
    prepared = False
    if meta is None and cache.local_rank() != 0:
        meta = cache.wait_for(cache_dir, key, should_stop=should_stop)
    elif meta is None:
        meta, prepared = cache.prepare_once(cache_dir, key, lambda tmp: prepare(source, tokenizer, spec, tmp,
                                                                                should_stop))  # fmt: skip
    dataset = ShardedDataset(cache_dir / key, meta)
    if prepared:
        per_core = meta["tokens_per_s"] / max(1, meta["cores"])
        log.info(
            "data: tokenized %s into %d sequences of %d tokens in %.2fs (%.0f tokens/s, %.0f per core on %d); "
            "cached at %s",
            source.describe(), len(dataset), spec.seq_len, meta["seconds"], meta["tokens_per_s"], per_core,
            meta["cores"], cache_dir / key,
        )  # fmt: skip
    else:
        log.info("data: mapped %d packed sequences from the cache %s (no tokenization)", len(dataset), cache_dir / key)
    log.info("data: %s", describe_packing(meta))
    report_left_out(meta)
    return dataset


class BlockRange:
    """Blocks [start, stop) of a ShardedDataset: the training part, or the held-out part, of TRAIN_EVAL_SPLIT."""

    def __init__(self, dataset: ShardedDataset, start: int, stop: int) -> None:
        self.dataset, self.start, self.stop = dataset, start, stop
        self.meta, self.seq_len = dataset.meta, dataset.seq_len

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.dataset[self.start + i]


def hold_out(dataset: ShardedDataset, fraction: float) -> tuple[BlockRange, BlockRange]:
    """(training blocks, the last `fraction` of the blocks) for TRAIN_EVAL_SPLIT; ConfigError when either is empty.

    The held-out blocks are the same on every rank and every run (the cache is deterministic); training never
    sees them."""
    held = round(len(dataset) * fraction)
    if held < 1 or held >= len(dataset):
        raise ConfigError(
            f"TRAIN_EVAL_SPLIT={fraction}: {len(dataset)} packed sequences leave {held} for evaluation; use a larger "
            "fraction or more data, or TRAIN_EVAL_DATA"
        )
    cut = len(dataset) - held
    return BlockRange(dataset, 0, cut), BlockRange(dataset, cut, len(dataset))
