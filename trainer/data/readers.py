"""Reading records from every supported file kind as a stream of bounded work units.

`iter_units(source, text_field)` yields, in corpus order:
- `LineChunk`: about UNIT_BYTES of whole lines of a .txt or .jsonl file (decompressed), with the number of its
  first line. Parsing it (`parse_chunk`) is the costly part, so it happens in worker processes.
- `Columns`: records already parsed by pyarrow (parquet, arrow, csv, .json documents, save_to_disk folders),
  sliced to about UNIT_BYTES.
Nothing here holds more than one unit of a file (a parquet row group, or one .json document, at most), so memory
does not grow with the corpus. A .txt file is one document: the EOS follows its last chunk only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.data.chat import (
    CHAT_LAYOUTS,
    LAYOUT_NAMES,
    BadRecord,
    columns_of_layout,
    conversation_of,
    file_layout,
    layout_of_columns,
    layout_of_record,
)
from trainer.data.formats import (
    MAX_LINE_BYTES,
    bad_line_message,
    decode_errors,
    file_kind,
    long_line_message,
    open_binary,
    open_text,
)  # fmt: skip
from trainer.errors import ConfigError
from trainer.provenance import StreamHash

UNIT_BYTES = 1 << 20
TEXT_PIECE_BYTES = 1 << 16  # a .txt chunk is cut at newlines into pieces this long, so a tokenizer batch parallelizes
ROWS_PER_BATCH = 1024
PAIR = ("prompt", "completion")
CHAT_KEYS = ("messages", "conversations")


@dataclass
class LineChunk:
    path: str
    format: str  # "text" or "jsonl"
    data: bytes
    first_line: int
    last: bool  # the file's last chunk
    first: bool = True  # the file's first chunk
    layout: str | None = None  # the file's record layout (chat.layout_of_record of its first record)


@dataclass
class Columns:
    """Parsed records: `texts`, or `prompts` with `completions` (pyarrow string/binary arrays), or
    `conversations` (chat.Conversation)."""

    origin: str
    texts: Any = None
    prompts: Any = None
    completions: Any = None
    conversations: list[Any] | None = None
    eos: str = "each"  # after each record; "last": after the last one only; "none"
    starts_document: bool = True  # False for a .txt chunk after the file's first
    bad: list[str] = field(default_factory=list)  # malformed lines, "path:line: why"
    without_text: int = 0  # records whose text field is null or missing

    @property
    def records(self) -> int:
        if self.conversations is not None:
            return len(self.conversations)
        column = self.texts if self.texts is not None else self.prompts
        return 0 if column is None else len(column)


def iter_units(source: Any, text_field: str) -> Iterator[LineChunk | Columns]:
    if source.saved_dataset:
        yield from _saved_dataset(source.saved_dataset, text_field)
        return
    for path in source.files:
        kind = file_kind(path)
        assert kind is not None, path  # discovery lists data files only
        fmt = kind.format
        try:
            if fmt in ("text", "jsonl"):
                yield from _line_chunks(path, fmt, file_layout(path, text_field) if fmt == "jsonl" else None)
            elif fmt == "json":
                yield from _json_file(path, text_field)
            else:
                yield from _table_file(path, fmt, text_field)
        except _read_errors() as exc:
            raise ConfigError(f"{path}: cannot read ({exc}); the file is unreadable, truncated or corrupt") from exc


def _read_errors() -> tuple[type[BaseException], ...]:
    return decode_errors()


# ---- line formats: read in the main process, parsed in workers --------------------------------------------------


def _line_chunks(path: Path, fmt: str, layout: str | None = None) -> Iterator[LineChunk]:
    """Whole lines, about UNIT_BYTES at a time (a longer line is one chunk, up to MAX_LINE_BYTES); the last one is
    flagged. The blocks of an unfinished line are kept in a list and joined once its end arrives: linear time."""
    pending: LineChunk | None = None
    line = 1
    hashed = StreamHash(path)  # provenance's sha256 of the file, from these reads (no pass of its own)
    with hashed.open() as raw, open_binary(path, raw) as handle:
        carry: list[bytes] = []
        carried = 0
        while True:
            block = handle.read(UNIT_BYTES)
            end = block.find(b"\n")
            if fmt != "text" and carried + (len(block) if end < 0 else end) > MAX_LINE_BYTES:
                raise ConfigError(long_line_message(path, line))
            if block and end < 0 and (fmt != "text" or carried + len(block) < UNIT_BYTES):
                carried += len(block)
                carry.append(block)
                continue
            data = b"".join([*carry, block])
            if not data:
                break
            cut = data.rfind(b"\n") + 1 if block else len(data)
            if cut == 0:
                cut = _utf8_boundary(data)  # a .txt without newlines: cut between characters
            chunk, rest = data[:cut], data[cut:]
            carry, carried = ([rest], len(rest)) if rest else ([], 0)
            if pending is not None:
                yield pending
            pending = LineChunk(str(path), fmt, chunk, line, last=False, first=pending is None, layout=layout)
            line += chunk.count(b"\n")
            if not block:
                break
        hashed.finish()
    if pending is not None:
        pending.last = True
        yield pending


def _utf8_boundary(data: bytes) -> int:
    """A cut near the end of `data` that does not split a UTF-8 character."""
    cut = len(data) - 4
    while (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut


def parse_chunk(chunk: LineChunk, text_field: str) -> Columns:
    """A chunk's records. JSON Lines go through pyarrow; a chunk it refuses is parsed line by line to name the
    malformed lines (they are returned in `bad`, never dropped in silence)."""
    import pyarrow as pa

    if chunk.format == "text":
        pieces = _text_pieces(chunk.data)
        return Columns(chunk.path, texts=pa.array(pieces, pa.large_binary()), eos="last" if chunk.last else "none",
                       starts_document=chunk.first)  # fmt: skip
    if chunk.layout in CHAT_LAYOUTS:
        return _jsonl_python(chunk, text_field)
    try:
        return _jsonl_arrow(chunk, text_field)
    except pa.ArrowInvalid:  # a malformed line, or a record of another layout: named line by line
        return _jsonl_python(chunk, text_field)


def _text_pieces(data: bytes) -> list[bytes]:
    pieces, start = [], 0
    while start < len(data):
        end = data.find(b"\n", start + TEXT_PIECE_BYTES)
        end = len(data) if end < 0 else end + 1
        pieces.append(data[start:end])
        start = end
    return pieces


def _jsonl_arrow(chunk: LineChunk, text_field: str) -> Columns:
    import pyarrow as pa
    import pyarrow.json as pajson

    names = list(dict.fromkeys([text_field, *PAIR, *CHAT_KEYS]))  # a list under a chat key is ArrowInvalid here
    options = pajson.ParseOptions(
        explicit_schema=pa.schema([(n, pa.string()) for n in names]), unexpected_field_behavior="ignore"
    )
    read = pajson.ReadOptions(use_threads=False, block_size=len(chunk.data) + 1)
    table = pajson.read_json(pa.BufferReader(chunk.data), read_options=read, parse_options=options)
    return _columns_from_table(table, text_field, chunk.path)


def _jsonl_python(chunk: LineChunk, text_field: str) -> Columns:
    rows, bad, wheres = [], [], []
    for offset, raw in enumerate(chunk.data.split(b"\n")):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            why = f"not valid JSON ({getattr(exc, 'msg', exc)}); each line must be one JSON object"
            bad.append(bad_line_message(chunk.path, chunk.first_line + offset, why))
            continue
        if not isinstance(row, dict):
            why = f"expected a JSON object, got {type(row).__name__}"
            bad.append(bad_line_message(chunk.path, chunk.first_line + offset, why))
            continue
        rows.append(row)
        wheres.append(f"{chunk.path}:{chunk.first_line + offset}")
    columns = _columns_from_rows(rows, text_field, chunk.path, chunk.layout, wheres)
    columns.bad = bad + columns.bad
    return columns


# ---- records to Columns ----------------------------------------------------------------------------------------


def _is_pair_table(table: Any) -> bool:
    return all(n in table.column_names and table[n].null_count < len(table) for n in PAIR)


def _columns_from_table(table: Any, text_field: str, origin: str) -> Columns:
    import pyarrow.compute as pc

    if _is_pair_table(table):
        both = pc.and_(pc.is_valid(table["prompt"]), pc.is_valid(table["completion"]))
        kept = table.filter(both)
        missing = len(table) - len(kept)
        return Columns(origin, prompts=_as_text(kept["prompt"]), completions=_as_text(kept["completion"]),
                       without_text=missing)  # fmt: skip
    if text_field not in table.column_names:
        return Columns(origin, texts=_as_text(table.column(0).slice(0, 0)), without_text=len(table))
    column = table[text_field]
    return Columns(origin, texts=_as_text(pc.drop_null(column)), without_text=column.null_count)


def _as_text(column: Any) -> Any:
    """One contiguous string/binary array (numbers become their text, as str() would write them)."""
    import pyarrow as pa

    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)
            or pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type)):  # fmt: skip
        array = array.cast(pa.string())
    return array


def _columns_from_rows(rows: list[dict[str, Any]], text_field: str, origin: str, layout: str | None = None,
                       wheres: list[str] | None = None) -> Columns:  # fmt: skip
    """Python records -> Columns, by the same rules as pyarrow's (values as their text, null or missing: no text).
    A conversation in a file of other records, or another record in a file of conversations (`layout`, its first
    record's), is a bad line, named by `wheres`; text and prompt/completion records may share a file."""
    import pyarrow as pa

    wheres = wheres or [f"{origin}:record {n}" for n in range(1, len(rows) + 1)]
    layout = layout or next((layout_of_record(r, text_field) for r in rows), None)
    kept, bad = [], []
    for row, where in zip(rows, wheres, strict=True):
        found = layout_of_record(row, text_field)
        if (layout in CHAT_LAYOUTS or found in CHAT_LAYOUTS) and found != layout:
            bad.append(f"{where}: a {LAYOUT_NAMES.get(found or '', 'record without known fields')} record in a file of "
                       f"{LAYOUT_NAMES.get(layout or '', 'other')} records; keep one layout per file")  # fmt: skip
            continue
        kept.append((row, where))
    if layout in CHAT_LAYOUTS:
        columns = _chat_columns(kept, layout, origin)
    else:
        names = list(dict.fromkeys([text_field, *PAIR]))
        values = {n: [None if r.get(n) is None else str(r[n]) for r, _ in kept] for n in names}
        table = pa.table({n: pa.array(v, pa.string()) for n, v in values.items()})
        columns = _columns_from_table(table, text_field, origin)
    columns.bad = bad + columns.bad
    return columns


def _chat_columns(rows: list[tuple[dict[str, Any], str]], layout: str, origin: str) -> Columns:
    conversations, bad = [], []
    for row, where in rows:
        try:
            conversations.append(conversation_of(row, layout, where))
        except BadRecord as exc:
            bad.append(f"{where}: {exc}")
    return Columns(origin, conversations=conversations, bad=bad)


def _slices(batches: Iterator[Any], text_field: str, origin: str) -> Iterator[Columns]:
    """Tables (or record batches) as Columns of about UNIT_BYTES each; conversations are named by record number."""
    first = 1
    for table in batches:
        if table.num_rows == 0:
            continue
        layout = layout_of_columns(table.schema, text_field)
        per_row = max(1, table.nbytes // table.num_rows)
        step = max(1, UNIT_BYTES // per_row)
        for start in range(0, table.num_rows, step):
            part = table.slice(start, step)
            if layout in CHAT_LAYOUTS:
                rows = part.to_pylist()
                wheres = [f"{origin}:record {first + start + n}" for n in range(len(rows))]
                yield _chat_columns(list(zip(rows, wheres, strict=True)), layout, origin)
            else:
                yield _columns_from_table(part, text_field, origin)
        first += table.num_rows


def needed_columns(schema: Any, text_field: str, origin: str) -> list[str]:
    layout = layout_of_columns(schema, text_field)
    if layout is None or layout == "prompt":  # prompts alone are online RL's (trainer.data.prompts reads them)
        names = schema.names
        raise ConfigError(
            f"{origin}: no field {text_field!r} (fields: {', '.join(names) or 'none'}); set TRAIN_TEXT_FIELD, "
            "or use prompt/completion, messages or conversations fields"
        )
    return columns_of_layout(layout, text_field)


# ---- columnar files and documents: read (by pyarrow) in the main process ----------------------------------------


def _table_file(path: Path, fmt: str, text_field: str) -> Iterator[Columns]:
    readers = {"parquet": _parquet_batches, "arrow": _arrow_batches, "csv": _csv_batches}
    yield from _slices(readers[fmt](path, text_field), text_field, str(path))


def _parquet_batches(path: Path, text_field: str) -> Iterator[Any]:
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    columns = needed_columns(parquet.schema_arrow, text_field, str(path))
    yield from parquet.iter_batches(batch_size=ROWS_PER_BATCH, columns=columns)


def _arrow_batches(path: Path, text_field: str) -> Iterator[Any]:
    """An Arrow IPC file, stream format (what `datasets` writes) or file format, memory-mapped."""
    import pyarrow as pa

    with pa.memory_map(str(path)) as source:
        try:
            reader = pa.ipc.open_stream(source)
        except pa.ArrowInvalid:
            source.seek(0)
            file_reader = pa.ipc.open_file(source)
            reader = (file_reader.get_batch(i) for i in range(file_reader.num_record_batches))
            schema = file_reader.schema
        else:
            schema = reader.schema
        columns = needed_columns(schema, text_field, str(path))
        for batch in reader:
            yield batch.select(columns)


def _csv_batches(path: Path, text_field: str) -> Iterator[Any]:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    try:
        reader = pacsv.open_csv(path)
        columns = needed_columns(reader.schema, text_field, str(path))
        for batch in reader:
            yield batch.select(columns)
    except pa.ArrowInvalid as exc:
        raise ConfigError(f"{path}: cannot read as CSV ({exc})") from exc


def _json_file(path: Path, text_field: str) -> Iterator[LineChunk | Columns]:
    """A .json file is one JSON document (a list of records, or an object holding one), or JSON Lines."""
    if _looks_like_json_lines(path):
        yield from _line_chunks(path, "jsonl", file_layout(path, text_field))
        return
    with open_text(path) as handle:
        try:
            content = json.load(handle)
        except json.JSONDecodeError as exc:
            raise ConfigError(bad_line_message(path, exc.lineno, f"not valid JSON ({exc.msg})")) from exc
    if isinstance(content, dict) and layout_of_record(content, text_field) not in CHAT_LAYOUTS:
        lists = [v for v in content.values() if isinstance(v, list)]
        content = lists[0] if len(lists) == 1 else [content]
    content = [content] if isinstance(content, dict) else content
    if not isinstance(content, list) or not all(isinstance(r, dict) for r in content):
        raise ConfigError(f"{path}: expected a list of JSON objects (or JSON Lines)")
    layout = next((layout_of_record(r, text_field) for r in content), None)
    for start in range(0, len(content), ROWS_PER_BATCH):
        rows = content[start : start + ROWS_PER_BATCH]
        wheres = [f"{path}:record {start + n}" for n in range(1, len(rows) + 1)]
        yield _columns_from_rows(rows, text_field, str(path), layout, wheres)


def _looks_like_json_lines(path: Path) -> bool:
    """True when the first line is a whole JSON object and more follows (a JSON document spans lines instead)."""
    with open_text(path) as handle:
        first = handle.readline(MAX_LINE_BYTES)  # a minified document is one long line: only its start is read
        rest = handle.read(1)
    try:
        return isinstance(json.loads(first), dict) and bool(rest)
    except json.JSONDecodeError:
        return False


def _saved_dataset(folder: Path, text_field: str) -> Iterator[Columns]:
    import logging

    from datasets import DatasetDict, load_from_disk

    dataset = load_from_disk(str(folder))  # memory-mapped
    if isinstance(dataset, DatasetDict):
        split = "train" if "train" in dataset else next(iter(dataset))
        logging.getLogger("trainer").info("data: using split %r of %s", split, folder)
        dataset = dataset[split]
    table = dataset.data.table
    columns = needed_columns(table.schema, text_field, str(folder))
    yield from _slices(table.select(columns).to_batches(max_chunksize=ROWS_PER_BATCH), text_field, str(folder))
