"""Training data: find files, read text (or prompt/completion pairs), tokenize, EOS-join, pack, cache.

Supported: .txt, .jsonl/.json (field TRAIN_TEXT_FIELD), .parquet, .csv, and `datasets.save_to_disk`
folders. Records with `prompt` and `completion` fields train with the loss on the completion only
(labels are -100 on prompt tokens). Everything is packed into blocks of `seq_len` tokens and cached
as .npy files keyed by the files' identity (path, size, mtime), the tokenizer and `seq_len`, so a
restart does not tokenize again.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainer.errors import ConfigError

log = logging.getLogger("trainer")

DEFAULT_DATA = "/data"
EXTENSIONS = {".txt": "text", ".jsonl": "jsonl", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
EMBEDDED_CORPUS = Path(__file__).parent / "assets" / "corpus.txt"
CACHE_VERSION = 2
IGNORE_INDEX = -100
TEXT_CHUNK_CHARS = 1 << 16  # .txt files are tokenized in newline-aligned chunks so batches parallelize
BATCH_RECORDS = 1000


@dataclass
class DataSource:
    """What to read: either files of one or more formats, or a save_to_disk folder."""

    files: list[Path] = field(default_factory=list)
    saved_dataset: Path | None = None
    embedded: bool = False

    def describe(self) -> str:
        if self.embedded:
            return "the embedded default corpus"
        if self.saved_dataset:
            return f"datasets.save_to_disk folder {self.saved_dataset}"
        return f"{len(self.files)} file(s)" + (f" ({self.files[0]})" if len(self.files) == 1 else "")

    def identity_files(self) -> list[Path]:
        if self.saved_dataset:
            return sorted(p for p in self.saved_dataset.rglob("*") if p.is_file())
        return self.files


@dataclass
class Records:
    """One batch of records: texts, or prompts with completions."""

    texts: list[str] | None = None
    prompts: list[str] | None = None
    completions: list[str] | None = None


# ---------------------------------------------------------------- finding data


def _is_saved_dataset(folder: Path) -> bool:
    return (
        (folder / "dataset_info.json").exists()
        or (folder / "dataset_dict.json").exists()
        or (folder / "state.json").exists()
    )


def _data_files(paths: list[Path]) -> list[Path]:
    return sorted(p for p in paths if p.is_file() and p.suffix.lower() in EXTENSIONS and not p.name.startswith("."))


def find_data(spec: str) -> DataSource:
    """Resolve TRAIN_DATA. The default path missing or empty means the embedded corpus; any other miss is an error."""
    path = Path(spec)
    if any(ch in spec for ch in "*?["):
        source = DataSource(files=_data_files([Path(p) for p in glob.glob(spec, recursive=True)]))
    elif path.is_dir():
        if _is_saved_dataset(path):
            return DataSource(saved_dataset=path)
        source = DataSource(files=_data_files(list(path.rglob("*"))))
    elif path.is_file():
        if path.suffix.lower() not in EXTENSIONS:
            raise ConfigError(
                f"TRAIN_DATA={spec}: unsupported file type {path.suffix!r}; "
                f"use one of {', '.join(EXTENSIONS)} or a datasets.save_to_disk folder"
            )
        source = DataSource(files=[path])
    else:
        source = DataSource()
    if source.files:
        return source
    if spec.rstrip("/") == DEFAULT_DATA:
        return DataSource(files=[EMBEDDED_CORPUS], embedded=True)
    raise ConfigError(
        f"TRAIN_DATA={spec}: no data found (no {', '.join(EXTENSIONS)} files, no datasets.save_to_disk folder); "
        "point TRAIN_DATA at a file, folder or glob that exists"
    )


# ---------------------------------------------------------------- reading records


def _records_from_rows(rows: list[dict[str, Any]], text_field: str, origin: str) -> Records:
    if not rows:
        return Records(texts=[])
    first = rows[0]
    if "prompt" in first and "completion" in first:
        try:
            return Records(prompts=[str(r["prompt"]) for r in rows], completions=[str(r["completion"]) for r in rows])
        except KeyError as exc:
            raise ConfigError(f"{origin}: a record lacks {exc.args[0]!r} while others have prompt/completion") from exc
    if text_field not in first:
        keys = ", ".join(sorted(map(str, first))) or "none"
        raise ConfigError(
            f"{origin}: no field {text_field!r} (fields: {keys}); set TRAIN_TEXT_FIELD, or use prompt/completion fields"
        )
    try:
        return Records(texts=[str(r[text_field]) for r in rows if r[text_field] is not None])
    except KeyError as exc:
        raise ConfigError(f"{origin}: a record has no field {text_field!r}") from exc


def _needed_columns(names: list[str], text_field: str, origin: str) -> list[str]:
    if "prompt" in names and "completion" in names:
        return ["prompt", "completion"]
    if text_field not in names:
        raise ConfigError(
            f"{origin}: no field {text_field!r} (fields: {', '.join(names) or 'none'}); set TRAIN_TEXT_FIELD, "
            "or use prompt/completion fields"
        )
    return [text_field]


def _columns_to_records(columns: dict[str, list[Any]]) -> Records:
    if "prompt" in columns:
        return Records(prompts=[str(x) for x in columns["prompt"]], completions=[str(x) for x in columns["completion"]])
    (values,) = columns.values()
    return Records(texts=[str(x) for x in values if x is not None])


def _read_text(path: Path) -> Iterator[Records]:
    """A .txt file is one document, read in newline-aligned chunks; the EOS goes after its last chunk."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        content = fh.read()
    chunks, start = [], 0
    while start < len(content):
        end = content.find("\n", start + TEXT_CHUNK_CHARS)
        end = len(content) if end < 0 else end + 1
        chunks.append(content[start:end])
        start = end
    if chunks:
        yield Records(texts=chunks)


def _read_jsonl(path: Path, text_field: str) -> Iterator[Records]:
    """JSON Lines through pyarrow's C++ reader; the line-by-line Python reader explains files it refuses."""
    import pyarrow as pa
    import pyarrow.json as pajson

    try:
        table = pajson.read_json(path)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        yield from _read_jsonl_python(path, text_field)
        return
    yield from _read_table(table, text_field, str(path))


def _read_jsonl_python(path: Path, text_field: str) -> Iterator[Records]:
    rows: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{lineno}: not valid JSON ({exc.msg}); each line must be one object") from exc
            if not isinstance(row, dict):
                raise ConfigError(f"{path}:{lineno}: expected a JSON object per line, got {type(row).__name__}")
            rows.append(row)
            if len(rows) >= BATCH_RECORDS:
                yield _records_from_rows(rows, text_field, str(path))
                rows = []
    if rows:
        yield _records_from_rows(rows, text_field, str(path))


def _read_json(path: Path, text_field: str) -> Iterator[Records]:
    try:
        with open(path, encoding="utf-8") as fh:
            content = json.load(fh)
    except json.JSONDecodeError:
        yield from _read_jsonl_python(path, text_field)  # JSON Lines saved as .json
        return
    if isinstance(content, dict):
        lists = [v for v in content.values() if isinstance(v, list)]
        content = lists[0] if len(lists) == 1 else [content]
    if not all(isinstance(r, dict) for r in content):
        raise ConfigError(f"{path}: expected a list of JSON objects (or JSON Lines)")
    for i in range(0, len(content), BATCH_RECORDS):
        yield _records_from_rows(content[i : i + BATCH_RECORDS], text_field, str(path))


def _read_table(table: Any, text_field: str, origin: str) -> Iterator[Records]:
    table = table.select(_needed_columns(table.column_names, text_field, origin))
    for batch in table.to_batches(max_chunksize=BATCH_RECORDS * 10):
        yield _columns_to_records(batch.to_pydict())


def _read_parquet(path: Path, text_field: str) -> Iterator[Records]:
    import pyarrow.parquet as pq

    yield from _read_table(pq.read_table(path), text_field, str(path))


def _read_csv(path: Path, text_field: str) -> Iterator[Records]:
    import pyarrow.csv as pacsv

    try:
        table = pacsv.read_csv(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid with a useful message
        raise ConfigError(f"{path}: cannot read as CSV ({exc})") from exc
    yield from _read_table(table, text_field, str(path))


def _read_saved_dataset(folder: Path, text_field: str) -> Iterator[Records]:
    from datasets import DatasetDict, load_from_disk

    ds = load_from_disk(str(folder))
    if isinstance(ds, DatasetDict):
        split = "train" if "train" in ds else next(iter(ds))
        log.info("data: using split %r of %s", split, folder)
        ds = ds[split]
    yield from _read_table(ds.data.table, text_field, str(folder))


def read_records(source: DataSource, text_field: str) -> Iterator[Records]:
    """Every record of the source, in batches; a .txt file yields one document."""
    if source.saved_dataset:
        yield from _read_saved_dataset(source.saved_dataset, text_field)
        return
    for path in source.files:
        kind = EXTENSIONS[path.suffix.lower()]
        try:
            if kind == "text":
                yield from _read_text(path)
            elif kind == "jsonl":
                yield from _read_jsonl(path, text_field)
            elif kind == "json":
                yield from _read_json(path, text_field)
            elif kind == "parquet":
                yield from _read_parquet(path, text_field)
            else:
                yield from _read_csv(path, text_field)
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read ({exc}); check the file and its permissions") from exc


# ---------------------------------------------------------------- tokenizing and packing


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
        is_txt = EXTENSIONS[path.suffix.lower()] == "text"
        for r in read_records(DataSource(files=[path]), text_field):
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
    source = find_data(settings.data)
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
