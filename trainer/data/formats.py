"""What a data file is, and how to open it: suffixes, compression, and the wording of a bad line.

`file_kind(path)` says what a file holds by its suffixes (`train.jsonl.zst` is zstd-compressed JSON Lines);
`open_binary`/`open_text` open it, decompressing .gz, .zst, .bz2 and .xz on the fly. Torch- and numpy-free:
discovery uses it in the checks that run before anything heavy is imported.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from trainer.errors import ConfigError

FORMATS = {".txt": "text", ".jsonl": "jsonl", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".bz2": "bz2", ".xz": "xz"}
COMPRESSIBLE = ("text", "jsonl", "json")
SUPPORTED = ", ".join(FORMATS) + " (.txt, .jsonl, .json also compressed: .gz, .zst, .bz2, .xz)"
BAD_LINES_VARIABLE = "TRAIN_DATA_MAX_BAD_LINES"


@dataclass(frozen=True)
class FileKind:
    format: str
    compression: str | None = None


def is_glob(spec: str) -> bool:
    """A glob pattern (of data files), not a path."""
    return any(ch in spec for ch in "*?[")


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


def open_binary(path: Path, raw: IO[bytes] | None = None) -> IO[bytes]:
    """The file's bytes, decompressed as they are read; from `raw` (the file's own bytes, opened by the caller, who
    closes it) when given."""
    kind = file_kind(path)
    compression = kind.compression if kind else None
    source: Any = path if raw is None else raw
    if compression == "gzip":
        import gzip

        return gzip.open(source, "rb")
    if compression == "bz2":
        import bz2

        return bz2.open(source, "rb")
    if compression == "xz":
        import lzma

        return lzma.open(source, "rb")
    if compression == "zstd":
        try:
            import zstandard
        except ImportError:
            raise ConfigError(f"{path}: reading .zst needs the zstandard package (pip install zstandard)") from None
        return zstandard.open(source, "rb")
    return open(path, "rb") if raw is None else raw


def open_text(path: Path) -> IO[str]:
    """The file's text (UTF-8, undecodable bytes replaced), decompressed as it is read."""
    return io.TextIOWrapper(open_binary(path), encoding="utf-8", errors="replace", newline="")


def decode_errors() -> tuple[type[BaseException], ...]:
    """What a truncated or corrupt file raises while it is decompressed or decoded (a corrupt .gz: zlib.error,
    which is no OSError)."""
    import lzma
    import zlib

    errors: tuple[type[BaseException], ...] = (
        OSError, EOFError, UnicodeDecodeError, ValueError, lzma.LZMAError, zlib.error,
    )  # fmt: skip
    try:
        import zstandard

        errors += (zstandard.ZstdError,)
    except ImportError:
        pass
    return errors


MAX_LINE_BYTES = 64 << 20  # one JSON Lines record longer than this is refused (memory stays bounded)


def long_line_message(path: str | Path, line: int) -> str:
    return (
        f"TRAIN_DATA: {path}:{line}: a line longer than {MAX_LINE_BYTES >> 20} MiB; JSON Lines hold one record per "
        "line, so this is likely not a JSON Lines file (a JSON document? name it .json) or lacks its newlines"
    )


def bad_line_message(path: str | Path, line: int, reason: str) -> str:
    """One malformed record, by file and line number."""
    return f"{path}:{line}: {reason}"


def too_many_bad_lines(first: str, count: int, allowed: int, variable: str = "TRAIN_DATA") -> str:
    """The error when the corpus that `variable` names holds more malformed lines than TRAIN_DATA_MAX_BAD_LINES
    allows."""
    if allowed == 0:
        return (
            f"{variable}: {first}; fix or remove that line, or set {BAD_LINES_VARIABLE} to skip up to that many "
            "malformed lines (each skipped line is reported)"
        )
    return (
        f"{variable}: more than {BAD_LINES_VARIABLE}={allowed} malformed lines ({count} so far; the first: {first}); "
        f"fix the data or raise {BAD_LINES_VARIABLE}"
    )
