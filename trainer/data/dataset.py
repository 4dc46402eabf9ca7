"""Tokenizing, packing and caching the records, and the map-style dataset the Trainer reads."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from trainer.data.discovery import EMBEDDED_CORPUS, DataSource, source_of
from trainer.data.formats import Records, file_kind, read_records
from trainer.errors import ConfigError

log = logging.getLogger("trainer")

CACHE_VERSION = 2
IGNORE_INDEX = -100


class Encoder:
    """Batched tokenization to numpy arrays. The byte-level tokenizer is exact UTF-8, so it skips the tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        from trainer.tokenizer import is_byte_level

        self.eos = int(tokenizer.eos_token_id)
        self.byte_level = is_byte_level(tokenizer)
        self.backend = getattr(tokenizer, "backend_tokenizer", None)
        self.tokenizer = tokenizer

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        if self.byte_level:
            return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.int32) for t in texts]
        if self.backend is not None:
            encodings = self.backend.encode_batch_fast(texts, add_special_tokens=False)
            return [np.asarray(e.ids, dtype=np.int32) for e in encodings]
        ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        return [np.asarray(x, dtype=np.int32) for x in ids]


def _join_with_eos(pieces: list[np.ndarray], eos: int, eos_after: list[bool]) -> np.ndarray:
    eos_arr = np.array([eos], dtype=np.int32)
    parts: list[np.ndarray] = []
    for piece, add_eos in zip(pieces, eos_after, strict=True):
        parts.append(piece)
        if add_eos:
            parts.append(eos_arr)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def tokenize_records(records: Records, enc: Encoder, is_txt: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """(token ids, labels or None) of one batch, EOS after each document.

    Labels are only made for prompt/completion records: -100 on the prompt, the ids on completion + EOS.
    """
    if records.texts is not None:
        pieces = enc.encode(records.texts)
        eos_after = [False] * (len(pieces) - 1) + [True] if is_txt else [True] * len(pieces)
        return _join_with_eos(pieces, enc.eos, eos_after), None
    prompts = enc.encode(records.prompts or [])
    completions = enc.encode(records.completions or [])
    ids_parts, label_parts = [], []
    eos_arr = np.array([enc.eos], dtype=np.int32)
    for p, c in zip(prompts, completions, strict=True):
        ids_parts += [p, c, eos_arr]
        label_parts += [np.full(len(p), IGNORE_INDEX, dtype=np.int32), c, eos_arr]
    if not ids_parts:
        return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32)
    return np.concatenate(ids_parts), np.concatenate(label_parts)


def pack(ids: np.ndarray, labels: np.ndarray | None, seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
    """Cut the token stream into [n, seq_len] blocks; the remainder is dropped unless it is all there is."""
    n = len(ids) // seq_len
    if n == 0:
        padded = np.full(seq_len, pad_id, dtype=np.int32)
        padded[: len(ids)] = ids
        lab = np.full(seq_len, IGNORE_INDEX, dtype=np.int32)
        lab[: len(ids)] = ids if labels is None else labels
        mask = np.zeros(seq_len, dtype=np.int8)
        mask[: len(ids)] = 1
        return {"input_ids": padded[None], "labels": lab[None], "attention_mask": mask[None]}
    out = {"input_ids": ids[: n * seq_len].reshape(n, seq_len)}
    if labels is not None:
        out["labels"] = labels[: n * seq_len].reshape(n, seq_len)
    return out


def tokenize_and_pack(source: DataSource, tokenizer: Any, seq_len: int, text_field: str) -> dict[str, np.ndarray]:
    enc = Encoder(tokenizer)
    ids_parts: list[np.ndarray] = []
    label_parts: list[np.ndarray] = []
    has_labels = False
    for records, is_txt in _records_with_kind(source, text_field):
        ids, labels = tokenize_records(records, enc, is_txt)
        if labels is not None:
            has_labels = True
        ids_parts.append(ids)
        label_parts.append(ids if labels is None else labels)
    if not ids_parts or sum(len(p) for p in ids_parts) == 0:
        raise ConfigError(f"TRAIN_DATA: {source.describe()} holds no text; add some records or fix TRAIN_TEXT_FIELD")
    all_ids = np.concatenate(ids_parts)
    all_labels = np.concatenate(label_parts) if has_labels else None
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else enc.eos
    return pack(all_ids, all_labels, seq_len, int(pad_id))


def _records_with_kind(source: DataSource, text_field: str) -> Iterator[tuple[Records, bool]]:
    if source.saved_dataset:
        for r in read_records(source, text_field):
            yield r, False
        return
    for path in source.files:
        is_txt = file_kind(path).format == "text"
        for r in read_records(DataSource(str(path), files=(path,)), text_field):
            yield r, is_txt


# ---------------------------------------------------------------- cache


def tokenizer_fingerprint(tokenizer: Any) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(f"{text}|eos={tokenizer.eos_token_id}|pad={tokenizer.pad_token_id}".encode()).hexdigest()


def cache_key(source: DataSource, tokenizer: Any, seq_len: int, text_field: str) -> str:
    files = []
    for p in source.identity_files():
        st = p.stat()
        files.append([str(p.resolve()), st.st_size, st.st_mtime_ns])
    blob = json.dumps(
        {
            "v": CACHE_VERSION,
            "files": files,
            "tok": tokenizer_fingerprint(tokenizer),
            "seq": seq_len,
            "field": text_field,
        }
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def default_cache_dir(output_dir: str) -> Path:
    """/cache/trainkit/data in the image (a volume shared by runs), else OUTPUT_DIR/.cache/data."""
    shared = Path("/cache")
    if shared.is_dir() and os.access(shared, os.W_OK):
        return shared / "trainkit" / "data"
    return Path(output_dir) / ".cache" / "data"


def _save_cache(folder: Path, arrays: dict[str, np.ndarray]) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".tmp-{folder.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name, arr in arrays.items():
        np.save(tmp / f"{name}.npy", arr)
    try:
        os.rename(tmp, folder)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)


def _load_cache(folder: Path) -> dict[str, np.ndarray]:
    return {p.stem: np.load(p, mmap_mode="r") for p in sorted(folder.glob("*.npy"))}


def load_packed(source: DataSource, tokenizer: Any, seq_len: int, text_field: str, cache_dir: Path) -> dict[str, Any]:
    """Packed arrays for the source, from the cache when the same files, tokenizer and seq_len were seen."""
    folder = cache_dir / cache_key(source, tokenizer, seq_len, text_field)
    if folder.is_dir():
        arrays = _load_cache(folder)
        log.info(
            "data: loaded %d packed sequences from the cache %s (no tokenization)", len(arrays["input_ids"]), folder
        )
        return arrays
    import time

    start = time.perf_counter()
    arrays = tokenize_and_pack(source, tokenizer, seq_len, text_field)
    elapsed = time.perf_counter() - start
    tokens = arrays["input_ids"].size
    log.info(
        "data: tokenized %s into %d sequences of %d tokens in %.2fs (%.0f tokens/s); cached at %s",
        source.describe(),
        len(arrays["input_ids"]),
        seq_len,
        elapsed,
        tokens / max(elapsed, 1e-9),
        folder,
    )
    _save_cache(folder, arrays)
    return arrays


class PackedDataset:
    """Blocks of token ids; labels are the ids themselves unless a labels array (masked prompts) exists.

    A map-style dataset (len + getitem) for the DataLoader; torch is imported only when one is made, so this
    module stays light for `python -m trainer doctor`.
    """

    def __init__(self, arrays: dict[str, Any]) -> None:
        import torch

        self._from_numpy = torch.from_numpy
        self.input_ids = arrays["input_ids"]
        self.labels = arrays.get("labels")
        self.attention_mask = arrays.get("attention_mask")

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        ids = self._from_numpy(np.asarray(self.input_ids[i], dtype=np.int64))
        item = {"input_ids": ids}
        item["labels"] = ids.clone() if self.labels is None else self._from_numpy(np.asarray(self.labels[i], np.int64))
        if self.attention_mask is not None:
            item["attention_mask"] = self._from_numpy(np.asarray(self.attention_mask[i], dtype=np.int64))
        return item


def build_dataset(settings: Any, tokenizer: Any, cache_dir: Path | None = None) -> PackedDataset:
    source = source_of(settings)
    if source.problems:
        raise ConfigError(*source.problems)
    if source.embedded:
        log.warning(
            "data: %s is missing or empty: training on the small EMBEDDED DEFAULT CORPUS (%s); "
            "mount your data at /data or set TRAIN_DATA",
            settings.data,
            EMBEDDED_CORPUS.name,
        )
    else:
        log.info("data: %s", source.describe())
    cache = cache_dir or default_cache_dir(settings.output_dir)
    arrays = load_packed(source, tokenizer, settings.seq_len, settings.text_field, cache)
    return PackedDataset(arrays)
