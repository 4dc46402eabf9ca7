"""Records with images: their three layouts, each read into one form (messages of typed parts, images in order).

Layouts, detected per record (`layout_of_record`) like the text layouts:
- `image_messages`: OpenAI / TRL messages whose content is a list of parts, `{"type": "text", "text": ...}` and
  `{"type": "image"}` (the image inline under `image`, `path`, `url` or `base64`, an `image_url` part's url, or, for
  a bare placeholder, the next entry of the record's `images` list);
- `image_sharegpt`: ShareGPT / LLaMA-Factory turns (`conversations` of from/value, or `messages` of role/content
  text) with `<image>` placeholders and an `images` list;
- `image_llava`: LLaVA's `image` with `conversations` holding `<image>`.
A record whose placeholders and images differ in number, or one of whose images is missing, unreadable or corrupt
(trainer.data.images), is a bad record named by file and line; more than TRAIN_DATA_MAX_BAD_LINES of them stop the
run before the model loads, counted. Every image is read (decoded and hashed) once by `read_records`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.data.chat import FROM_ROLES, ROLES, BadRecord, Conversation, check_trainable
from trainer.data.formats import BAD_LINES_VARIABLE, file_kind, open_text
from trainer.data.images import ImageFacts, ImageRef, image_ref, read_image
from trainer.errors import ConfigError

log = logging.getLogger("trainer")

IMAGE_LAYOUTS = ("image_messages", "image_sharegpt", "image_llava")
IMAGE_LAYOUT_NAMES = {"image_messages": "messages with images", "image_sharegpt": "ShareGPT turns with <image> and "
                      "images", "image_llava": "LLaVA image + conversations"}  # fmt: skip
PLACEHOLDER = "<image>"
IMAGE_PART_KEYS = ("image", "path", "url", "base64", "image_url")
BAD_SHOWN = 5
NOT_A_RECORD = "\0not a record"  # the key under which a line that is no JSON object reaches record_of


def layout_of_record(row: dict[str, Any]) -> str | None:
    """The image layout of one record; None for a record without images (a text layout: trainer.data.chat)."""
    turns = row.get("messages")
    if isinstance(row.get("image"), (str, dict, bytes)) and isinstance(row.get("conversations"), list):
        return "image_llava"
    if isinstance(turns, list) and any(isinstance(t, dict) and isinstance(t.get("content"), list) for t in turns):
        return "image_messages"
    if "images" in row and isinstance(turns or row.get("conversations"), list):
        return "image_sharegpt" if not isinstance(turns, list) or _text_turns(turns) else "image_messages"
    return None


def layout_of_columns(names: list[str]) -> str | None:
    """The image layout of a table by its column names (Parquet, Arrow): an `images` or `image` column beside the
    turns."""
    if "image" in names and "conversations" in names:
        return "image_llava"
    if "images" in names and "conversations" in names:
        return "image_sharegpt"
    return "image_messages" if "images" in names and "messages" in names else None


def _text_turns(turns: list[Any]) -> bool:
    return all(not isinstance(t, dict) or isinstance(t.get("content"), str) for t in turns)


@dataclass
class ImageRecord:
    """A conversation whose messages hold typed parts, and its images in placeholder order."""

    conversation: Conversation
    images: list[ImageRef]
    facts: list[ImageFacts] = field(default_factory=list)  # filled by reading the images

    @property
    def where(self) -> str:
        return self.conversation.where


def record_of(row: dict[str, Any], layout: str, where: str, base: Path) -> ImageRecord:
    """The record in the one form; BadRecord says what is wrong with it (placeholders, roles, image values)."""
    if NOT_A_RECORD in row:  # a line that is no JSON object (_with_layouts)
        raise BadRecord(row[NOT_A_RECORD])
    if layout == "image_messages":
        messages, refs = _typed_messages(row.get("messages"), row.get("images"), base)
    else:
        images = [row.get("image")] if layout == "image_llava" else row.get("images")
        turns = row.get("conversations") if row.get("conversations") is not None else row.get("messages")
        messages, refs = _placeholder_turns(turns, images, base)
    return ImageRecord(Conversation(messages, 0, where), refs)


def _listed(images: Any) -> list[Any]:
    if images is None:
        return []
    if not isinstance(images, list):
        raise BadRecord(f"images must be a list of images, not {type(images).__name__}")
    return images


def _typed_messages(turns: Any, images: Any, base: Path) -> tuple[list[dict[str, Any]], list[ImageRef]]:
    listed, refs, placeholders, messages = _listed(images), [], 0, []
    for n, turn in enumerate(_turn_list(turns, "messages"), 1):
        role = _role(turn, "role", None, n, "messages")
        content = turn.get("content")
        parts: list[dict[str, Any]] = []
        for part in [{"type": "text", "text": content}] if isinstance(content, str) else _part_list(content, n):
            if part.get("type") == "text" or (part.get("type") is None and "text" in part):
                parts.append({"type": "text", "text": _text(part.get("text"), n)})
                continue
            if part.get("type") not in ("image", "image_url"):
                raise BadRecord(f"messages[{n}] has a part of type {part.get('type')!r}; parts are text or image")
            inline = next((part[k] for k in IMAGE_PART_KEYS if part.get(k) is not None), None)
            if inline is None:
                placeholders += 1
                if placeholders <= len(listed):
                    refs.append(image_ref(listed[placeholders - 1], base, f"images[{placeholders}]"))
            else:
                refs.append(image_ref(inline, base, f"messages[{n}] image"))
            parts.append({"type": "image"})
        messages.append({"role": role, "content": parts})
    _same_count(placeholders, len(listed), '{"type": "image"} placeholder(s)')
    return messages, refs


def _placeholder_turns(turns: Any, images: Any, base: Path) -> tuple[list[dict[str, Any]], list[ImageRef]]:
    """ShareGPT and LLaVA turns: each `<image>` in the text is the next image of the list."""
    listed, messages, count = _listed(images), [], 0
    name = "conversations"
    for n, turn in enumerate(_turn_list(turns, name), 1):
        key, mapping = ("from", FROM_ROLES) if "from" in turn else ("role", None)
        role = _role(turn, key, mapping, n, name)
        text = _text(turn.get("value" if key == "from" else "content"), n)
        parts: list[dict[str, Any]] = []
        for i, piece in enumerate(text.split(PLACEHOLDER)):
            if i:
                parts.append({"type": "image"})
            if piece:
                parts.append({"type": "text", "text": piece})
        count += text.count(PLACEHOLDER)
        messages.append({"role": role, "content": parts})
    _same_count(count, len(listed), f"{PLACEHOLDER} placeholder(s)")
    return messages, [image_ref(v, base, f"images[{i}]") for i, v in enumerate(listed, 1)]


def _same_count(placeholders: int, images: int, what: str) -> None:
    if placeholders != images:
        raise BadRecord(f"{placeholders} {what} but {images} image(s); each image needs exactly one placeholder")


def _turn_list(turns: Any, name: str) -> list[dict[str, Any]]:
    if not isinstance(turns, list) or not turns or not all(isinstance(t, dict) for t in turns):
        raise BadRecord(f"{name} must be a non-empty list of message objects")
    return turns


def _part_list(content: Any, n: int) -> list[dict[str, Any]]:
    if not isinstance(content, list) or not all(isinstance(p, dict) for p in content):
        raise BadRecord(f"messages[{n}] content must be text or a list of parts ({{'type': 'text'|'image', ...}})")
    return content


def _role(turn: dict[str, Any], key: str, mapping: dict[str, str] | None, n: int, name: str) -> str:
    raw = turn.get(key)
    role = mapping.get(raw) if mapping is not None and isinstance(raw, str) else raw
    if role not in ROLES:
        raise BadRecord(f"{name}[{n}] has unknown {key} {raw!r}; use one of {', '.join(mapping or ROLES)}")
    return str(role)


def _text(value: Any, n: int) -> str:
    if not isinstance(value, str):
        raise BadRecord(f"turn {n} has text of type {type(value).__name__}, not a string")
    return value


# ---- reading a source's records --------------------------------------------------------------------------------


@dataclass
class ImageRecords:
    """Every record of a source with images, read and checked once: its records (images read and hashed), the bad
    ones by file and line, and the layouts met."""

    records: list[ImageRecord]
    bad: list[str]
    layouts: tuple[str, ...]

    def image_files(self) -> list[Path]:
        """The image files the records read (provenance.json hashes each)."""
        return list(dict.fromkeys(Path(f.path) for r in self.records for f in r.facts if f.path))

    def images(self) -> int:
        return sum(len(r.images) for r in self.records)


def read_records(source: Any, loss_on: str, max_bad: int) -> ImageRecords:
    """Every record of `source` (a DataSource) with its images read; ConfigError naming file:line and the count
    when more than `max_bad` records are bad (TRAIN_DATA_MAX_BAD_LINES)."""
    records, bad, layouts = [], [], []
    for base, rows in _rows_by_file(source):
        for row, where, layout in rows:
            try:
                record = record_of(row, layout, where, base)
                check_trainable(record.conversation, loss_on)
                record.facts = [read_image(ref)[1] for ref in record.images]
            except BadRecord as exc:
                bad.append(f"{where}: {exc}")
                continue
            records.append(record)
            layouts.append(layout)
    report_bad(bad, max_bad, source.variable)
    return ImageRecords(records, bad, tuple(dict.fromkeys(layouts)))


def report_bad(bad: list[str], allowed: int, variable: str) -> None:
    if len(bad) > allowed:
        shown = "; ".join(bad[:BAD_SHOWN]) + (f"; and {len(bad) - BAD_SHOWN} more" if len(bad) > BAD_SHOWN else "")
        raise ConfigError(f"{variable}: {len(bad)} bad image record(s) ({BAD_LINES_VARIABLE}={allowed} allowed): "
                          f"{shown}; fix or remove them, or raise {BAD_LINES_VARIABLE} to skip them (each skipped "
                          "record is reported)")  # fmt: skip
    for line in bad:
        log.warning("data: skipped bad image record %s", line)
    if bad:
        log.warning("data: %s: skipped %d bad image record(s) (%s=%d)", variable, len(bad), BAD_LINES_VARIABLE, allowed)


Row = tuple[dict[str, Any], str, str]  # the record, its file:line, its layout


def _rows_by_file(source: Any) -> Iterator[tuple[Path, Iterator[Row]]]:
    """(the folder its image paths are relative to, its rows) per file of `source`."""
    if source.saved_dataset:
        yield source.saved_dataset, _table_rows(source.saved_dataset, "saved")
        return
    for path in source.files:
        kind = file_kind(path)
        fmt = kind.format if kind else "text"
        yield path.parent, (_json_rows(path, fmt) if fmt in ("jsonl", "json") else _table_rows(path, fmt))


def _json_rows(path: Path, fmt: str) -> Iterator[Row]:
    """JSON Lines (file:line; a line that is not JSON is a bad record) or one JSON document (file:record N)."""
    with open_text(path) as handle:
        text = handle.read()
    if fmt == "json":
        try:
            document = json.loads(text)
        except ValueError:
            document = None  # JSON Lines named .json
        if document is not None:
            items = document if isinstance(document, list) else [document]
            yield from _with_layouts([(row, f"{path}:record {n}") for n, row in enumerate(items, 1)])
            return
    rows: list[tuple[Any, str]] = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append((json.loads(line), f"{path}:{n}"))
            except ValueError as exc:
                rows.append((BadRecord(f"not valid JSON ({exc}); each line must be one JSON object"), f"{path}:{n}"))
    yield from _with_layouts(rows)


def _with_layouts(rows: list[tuple[Any, str]]) -> Iterator[Row]:
    first = next((layout_of_record(r) for r, _ in rows if isinstance(r, dict)), None) or "image_messages"
    for row, where in rows:
        if not isinstance(row, dict):
            why = str(row) if isinstance(row, BadRecord) else f"expected a JSON object, got {type(row).__name__}"
            yield {NOT_A_RECORD: why}, where, first  # record_of names it
            continue
        yield row, where, layout_of_record(row) or first


def _table_rows(path: Path, fmt: str) -> Iterator[Row]:
    """Parquet, Arrow and save_to_disk tables; an image column's values are bytes, paths or {bytes, path}."""
    table = _table(path, fmt)
    layout = layout_of_columns(table.column_names) or "image_messages"
    for n, row in enumerate(table.to_pylist(), 1):
        yield row, f"{path}:record {n}", layout_of_record(row) or layout


def _table(path: Path, fmt: str) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if fmt == "parquet":
        return pq.read_table(path)
    if fmt == "saved":
        from datasets import load_from_disk

        return load_from_disk(str(path)).data.table
    with pa.memory_map(str(path)) as source:
        try:
            return pa.ipc.open_stream(source).read_all()
        except pa.ArrowInvalid:
            source.seek(0)
            return pa.ipc.open_file(source).read_all()


def file_image_layout(path: Path) -> str | None:
    """The image layout of a data file by its first record (JSON) or its columns (Parquet, Arrow, a save_to_disk
    folder); None for a file without images, or one that cannot be read (the text readers name why)."""
    from trainer.data.formats import file_kind

    try:
        if path.is_dir():
            path = next(iter(sorted(path.rglob("*.arrow"))), path)
        kind = file_kind(path)
        if kind is not None and kind.format in ("parquet", "arrow"):
            from trainer.data.chat import _schema

            return layout_of_columns(list(_schema(path, kind.format).names))
        if kind is None or kind.format not in ("jsonl", "json"):
            return None
        row = _first_row(path)
    except Exception:  # a corrupt file: the reader reports it by name when it gets there
        return None
    return layout_of_record(row) if isinstance(row, dict) else None


def _first_row(path: Path) -> Any:
    with open_text(path) as handle:
        first = next((line for line in handle if line.strip()), "")
        try:
            return json.loads(first)
        except ValueError:
            first += handle.read()
    document = json.loads(first)
    return document[0] if isinstance(document, list) and document else document


def has_images(layouts: tuple[str, ...]) -> bool:
    return any(layout in IMAGE_LAYOUTS for layout in layouts)


def first_record_problem(path: Path, row: dict[str, Any], line: int) -> str | None:
    """What is wrong with a file's first image record, its images unread (the checks before anything heavy loads;
    the run reads every record and image)."""
    layout = layout_of_record(row)
    if layout is None:
        return None
    try:
        record_of(row, layout, f"{path}:{line}", path.parent)
    except BadRecord as exc:
        return f"{path}:{line}: {exc}"
    return None


def holds_images(row: Any) -> bool:
    """Whether a record of any layout carries images: an `images`/`image` value, or an image part in its messages
    (preference and prompt records included)."""
    if not isinstance(row, dict):
        return False
    if row.get("images") or row.get("image"):
        return True
    turns = [t for value in row.values() if isinstance(value, list) for t in value if isinstance(t, dict)]
    return any(isinstance(p, dict) and p.get("type") in ("image", "image_url")
               for t in turns if isinstance(t.get("content"), list) for p in t["content"])  # fmt: skip


def config_reads_images(config: dict[str, Any]) -> bool:
    """Whether a model config (config.json's content) is a vision-language model's: one with a vision tower
    (`vision_config`) that generates text (its class a ...ForConditionalGeneration, when named). Torch-free: the
    checks ask it before anything loads; the loader picks the model class by it (trainer.model.vision)."""
    named = [str(a) for a in config.get("architectures") or []]
    return isinstance(config.get("vision_config"), dict) and all(a.endswith("ForConditionalGeneration") for a in named)


def folder_reads_images(folder: str | Path) -> bool:
    try:
        config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config_reads_images(config)
