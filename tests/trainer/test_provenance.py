"""provenance.json in every output folder and `python -m trainer diff` (issue 38, items 1 and 3): real tiny runs.

One run with a secret in the environment: its provenance names the data file's sha256 (as hashlib computes it), the
distributions it imported (torch, transformers, at their installed versions), the seed, and holds no secret; final/'s
record names its sha256 and the model card export writes shows it. A second one-step run with another TRAIN_LR and
another data file at the same path: `diff` names exactly those two. A folder without provenance (an older
trainkit's) exits 2 naming the file.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
from pathlib import Path

import pytest
from train_runs import finish, start, train_env

from trainer import provenance
from trainer.__main__ import main
from trainer.checkpoint_record import read_record
from trainer.export.model_card import model_card
from trainer.export.source import resolve_source
from trainer.secrets import MASK

SECRET = "hf_provenanceToken123456789"


def diff(a: Path, b: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`python -m trainer diff A B` through the entry point (in this process: the command imports no torch)."""
    code = main(["diff", str(a), str(b)])
    out, err = capsys.readouterr()
    return code, out, err


def test_provenance_is_recorded_and_diff_names_what_changed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "train.txt"
    data.write_text("the quick brown fox jumps over the lazy dog\n" * 200)
    first, second = tmp_path / "a", tmp_path / "b"
    env = {**train_env(first, max_steps=1, data=data), "HF_TOKEN": SECRET}
    code, err = finish(start(env))
    assert code == 0, err[-3000:]

    text = (first / "provenance.json").read_text()
    assert SECRET not in text
    record = json.loads(text)
    assert record["data"][str(data)]["sha256"] == hashlib.sha256(data.read_bytes()).hexdigest()
    assert list(record["data"]) == [str(data)]
    for dist in ("torch", "transformers"):
        assert record["distributions"][dist] == importlib.metadata.version(dist)
    assert record["seed"] == 7
    assert record["image"] is None and record["outside_image"] is True  # this test runs outside any image
    assert MASK in (first / "run_config.json").read_text()  # the token was there to be leaked
    sha = hashlib.sha256(text.encode()).hexdigest()
    assert read_record(first / "final").provenance == {"file": "../provenance.json", "sha256": sha}
    card = model_card(resolve_source(first / "final"), "tiny", None, False)
    assert "## Provenance" in card and hashlib.sha256(data.read_bytes()).hexdigest() in card and SECRET not in card

    data.write_text("a different corpus, shorter than the first\n" * 150)
    code, err = finish(start(train_env(second, max_steps=1, data=data, lr="0.001")))
    assert code == 0, err[-3000:]
    code, out, err = diff(first, second, capsys)
    assert code == 0, err[-3000:]
    assert out.strip().splitlines()[-1] == f"2 difference(s): provenance.data.{data}.sha256, settings.TRAIN_LR", out

    older = tmp_path / "older"
    older.mkdir()
    (older / "run_config.json").write_text("{}")
    code, out, err = diff(first, older, capsys)
    assert code == 2, err
    assert f"{older / 'provenance.json'} is missing" in err and "older trainkit" in err


def test_the_image_is_what_the_build_wrote_and_the_host_passed(tmp_path: Path) -> None:
    build = tmp_path / "build.json"
    build.write_text(json.dumps({"org.trainkit.cuda": "12.8", "org.opencontainers.image.revision": "abc123"}))
    env = {"TRAINKIT_IMAGE": "127.0.0.1:5000/trainkit:cu128", "TRAINKIT_IMAGE_DIGEST": "sha256:" + "0" * 64}
    found = provenance.image(env, build)
    assert found["outside_image"] is False
    assert found["image"]["reference"] == "127.0.0.1:5000/trainkit@sha256:" + "0" * 64
    assert found["image"]["build"]["org.trainkit.cuda"] == "12.8"
    assert provenance.image({}, tmp_path / "absent.json") == {"image": None, "outside_image": True}


def test_a_restart_takes_the_recorded_hash_of_an_unchanged_file(tmp_path: Path) -> None:
    data = tmp_path / "train.txt"
    data.write_text("some text\n")
    first = provenance.fingerprints([data], {})
    assert first[str(data)]["sha256"] == hashlib.sha256(b"some text\n").hexdigest()
    recorded = {str(data): {**first[str(data)], "sha256": "recorded"}}  # what an earlier start wrote
    assert provenance.fingerprints([data], recorded)[str(data)]["sha256"] == "recorded"  # no second pass
    data.write_text("other text\n")
    os.utime(data, ns=(first[str(data)]["mtime_ns"] + 10**9,) * 2)  # same size, a later time: hashed again
    assert provenance.fingerprints([data], recorded)[str(data)]["sha256"] == hashlib.sha256(b"other text\n").hexdigest()


@pytest.mark.parametrize("name", ["train.txt", "train.jsonl.gz", "train.jsonl.zst"])
def test_the_fingerprint_is_taken_while_the_data_is_read(tmp_path: Path, name: str) -> None:
    """The tokenization pass hashes the file's own bytes (compressed ones as stored): fingerprints() then takes that
    hash, not a pass of its own (proved by changing the content behind an unchanged size and mtime)."""
    import gzip

    import zstandard

    from trainer.data.readers import _line_chunks

    lines = b"".join(b'{"text": "line %d of the corpus"}\n' % i for i in range(5000))
    stored = {".txt": lines, ".gz": gzip.compress(lines), ".zst": zstandard.ZstdCompressor().compress(lines)}
    path = tmp_path / name
    path.write_bytes(stored[path.suffix])
    read = b"".join(chunk.data for chunk in _line_chunks(path, "text" if name.endswith(".txt") else "jsonl"))
    assert read == lines
    stat = path.stat()
    path.write_bytes(bytes(len(stored[path.suffix])))  # other content, same size...
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # ...and time: only a second pass would see it
    found = provenance.fingerprints([path], {})[str(path)]
    assert found["sha256"] == hashlib.sha256(stored[path.suffix]).hexdigest()
