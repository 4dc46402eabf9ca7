"""Reading records from every supported file kind, compressed or not, in batches.

`file_kind(path)` says what a file holds by its suffixes (`.jsonl.gz` is gzip-compressed JSON Lines);
`open_text`/`open_binary` open it, decompressing .gz, .zst, .bz2 and .xz on the fly.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from trainer.errors import ConfigError

log = logging.getLogger("trainer")

FORMATS = {".txt": "text", ".jsonl": "jsonl", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".bz2": "bz2", ".xz": "xz"}
COMPRESSIBLE = ("text", "jsonl", "json")
SUPPORTED = ", ".join(FORMATS) + " (.txt, .jsonl, .json also compressed: .gz, .zst, .bz2, .xz)"
TEXT_CHUNK_CHARS = 1 << 16
BATCH_RECORDS = 1000


@dataclass(frozen=True)
class FileKind:
    format: str
    compression: str | None = None


def file_kind(path: Path) -> FileKind | None:
    """The format and compression of a data file by its suffixes; None for files that are not data."""
    name = path.name.lower()
    compression = next((c for s, c in COMPRESSIONS.items() if name.endswith(s)), None)
    if compression:
        name = name.rsplit(".", 1)[0]
    fmt = FORMATS.get(Path(name).suffix)
    if fmt is None or (compression and fmt not in COMPRESSIBLE):
        return None
    return FileKind(fmt, compression)


def open_binary(path: Path) -> IO[bytes]:
    """The file's bytes, decompressed."""
    kind = file_kind(path)
    compression = kind.compression if kind else None
    if compression == "gzip":
        import gzip

        return gzip.open(path, "rb")
    if compression == "bz2":
        import bz2

        return bz2.open(path, "rb")
    if compression == "xz":
        import lzma

        return lzma.open(path, "rb")
    if compression == "zstd":
        try:
            import zstandard
        except ImportError:
            raise ConfigError(f"{path}: reading .zst needs the zstandard package (pip install zstandard)") from None
        return zstandard.open(path, "rb")
    return open(path, "rb")


def open_text(path: Path) -> IO[str]:
    """The file's text (UTF-8, undecodable bytes replaced), decompressed."""
    return io.TextIOWrapper(open_binary(path), encoding="utf-8", errors="replace", newline="")


@dataclass
class Records:
    """One batch of records: texts, or prompts with completions."""

    texts: list[str] | None = None
    prompts: list[str] | None = None
    completions: list[str] | None = None


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
    with open_text(path) as fh:
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

    if file_kind(path).compression:
        yield from _read_jsonl_python(path, text_field)
        return
    try:
        table = pajson.read_json(path)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        yield from _read_jsonl_python(path, text_field)
        return
    yield from _read_table(table, text_field, str(path))


def _read_jsonl_python(path: Path, text_field: str) -> Iterator[Records]:
    rows: list[dict[str, Any]] = []
    with open_text(path) as fh:
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
        with open_text(path) as fh:
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


def read_records(source: Any, text_field: str) -> Iterator[Records]:
    """Every record of the source, in batches; a .txt file yields one document."""
    if source.saved_dataset:
        yield from _read_saved_dataset(source.saved_dataset, text_field)
        return
    for path in source.files:
        kind = file_kind(path).format
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
