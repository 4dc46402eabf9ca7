"""Records with images, read before any model: the three layouts and the Parquet image column read into one form,
paths relative to the data file, URLs refused, bad images and placeholder counts named by file:line and counted,
and the images hashed for provenance and resume. In-process, no model: about 2 s."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from vision_data import QUESTION, colour_row, picture

from trainer.data.discovery import discover
from trainer.data.vision import IMAGE_LAYOUTS, read_records
from trainer.errors import ConfigError
from trainer.provenance import fingerprints


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _read(path: Path, max_bad: int = 0):
    source = discover(str(path))
    assert not source.problems, source.problems
    return source, read_records(source, "assistant", max_bad)


def test_every_layout_reads_into_the_same_record(tmp_path: Path) -> None:
    """messages (inline image), messages + images, ShareGPT and LLaVA: one conversation and one image, the path
    relative to the data file's folder (a subfolder here, not the working directory)."""
    picture(tmp_path / "data" / "pics" / "a.png", "red", (30, 20))
    found = {}
    for layout in ("messages", "messages_images", "sharegpt", "llava"):
        source, read = _read(_jsonl(tmp_path / "data" / f"{layout}.jsonl", [colour_row("pics/a.png", "red", layout)]))
        assert set(source.layouts) <= set(IMAGE_LAYOUTS), source.layouts
        (record,) = read.records
        texts = [[p.get("text", "<image>") for p in m["content"]] for m in record.conversation.messages]
        found[layout] = (texts, [f.sha256 for f in record.facts], (record.facts[0].width, record.facts[0].height))
    first = found["messages"]
    assert first[0] == [["<image>", QUESTION], ["red"]] and first[2] == (30, 20)
    for layout, seen in found.items():
        assert [t.strip() for turn in seen[0] for t in turn] == [t for turn in first[0] for t in turn], layout
        assert seen[1:] == first[1:], layout


def test_parquet_image_column_and_embedded_bytes(tmp_path: Path) -> None:
    """The datasets Image feature ({bytes, path}) in Parquet, and base64 in JSON, are read as images."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    png = picture(tmp_path / "b.png", "blue", (28, 28)).read_bytes()
    turns = [{"from": "human", "value": f"<image>{QUESTION}"}, {"from": "gpt", "value": "blue"}]
    table = pa.table({"conversations": [turns], "images": [[{"bytes": png, "path": None}]]})
    pq.write_table(table, tmp_path / "train.parquet")
    source, read = _read(tmp_path / "train.parquet")
    assert source.layouts == ("image_sharegpt",)
    assert read.records[0].facts[0].path is None and read.records[0].facts[0].width == 28
    row = colour_row("x", "blue")
    row["messages"][0]["content"][0]["image"] = "data:image/png;base64," + base64.b64encode(png).decode()
    _, read = _read(_jsonl(tmp_path / "b64" / "train.jsonl", [row]))
    assert read.records[0].facts[0].sha256 == source_sha(png)


def source_sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def test_bad_images_and_placeholders_are_named_and_counted(tmp_path: Path) -> None:
    """Missing, corrupt and not-an-image files, a URL and placeholder counts that differ: each named by file:line,
    all counted, before any model; TRAIN_DATA_MAX_BAD_LINES skips them, counted, never silently."""
    good = picture(tmp_path / "ok.png", "green", (28, 28))
    (tmp_path / "cut.png").write_bytes(good.read_bytes()[:60])
    (tmp_path / "text.png").write_text("not a picture")
    two = colour_row("ok.png", "green", "messages_images")
    two["images"].append("ok.png")
    rows = [colour_row("ok.png", "green"), colour_row("gone.png", "red"), colour_row("cut.png", "red"),
            colour_row("text.png", "red"), colour_row("https://example.com/a.png", "red"), two,
            colour_row("ok.png", "green", "sharegpt") | {"images": []}]  # fmt: skip
    path = _jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(ConfigError) as refused:
        _read(path)
    message = refused.value.message
    assert "6 bad image record(s)" in message
    for line, why in ((2, "not found"), (3, "corrupt or truncated"), (4, "not an image"), (5, "is a URL"),
                      (6, "1 {\"type\": \"image\"} placeholder(s) but 2 image(s)")):  # fmt: skip
        assert f"{path}:{line}: " in message and why in message, (line, message)
    assert "nothing is downloaded" in message and "and 1 more" in message
    _, read = _read(path, max_bad=6)
    assert len(read.records) == 1 and len(read.bad) == 6
    assert f"{path}:7: 1 <image> placeholder(s) but 0 image(s)" in read.bad[-1]


def test_images_are_hashed_for_provenance_and_resume(tmp_path: Path) -> None:
    """The hash taken while reading is provenance's (no second read), and a resume on a changed image is refused
    naming it unless TRAIN_RESUME_CHANGED_DATA=1."""
    from trainer.provenance import write
    from trainer.run.vision import refuse_changed_images

    image = picture(tmp_path / "a.png", "red", (28, 28))
    _, read = _read(_jsonl(tmp_path / "train.jsonl", [colour_row("a.png", "red")]))
    (path,) = read.image_files()
    recorded = fingerprints([path], {})
    assert recorded[str(path)]["sha256"] == read.records[0].facts[0].sha256 == source_sha(image.read_bytes())
    out = tmp_path / "out"
    write(out, {"data": recorded})
    refuse_changed_images(read, out, allowed=False)  # unchanged: goes on
    picture(image, "blue", (28, 28))
    _, changed = _read(tmp_path / "train.jsonl")
    with pytest.raises(ConfigError, match=r"1 image\(s\) changed since the run recorded them \(.*a\.png\)"):
        refuse_changed_images(changed, out, allowed=False)
    refuse_changed_images(changed, out, allowed=True)
