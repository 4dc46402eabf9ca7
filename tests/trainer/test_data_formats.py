"""Data formats: packing and masking checked on the prepared shards, then real `python -m trainer` runs per format."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from train_runs import train_env

from trainer.data import discovery, shards
from trainer.data.dataset import load_or_prepare
from trainer.data.discovery import discover
from trainer.data.spec import DataSpec
from trainer.errors import ConfigError
from trainer.tokenizer import byte_level_tokenizer

REPO = Path(__file__).resolve().parents[2]
TEXTS = ["The first record.", "A second one, a little longer than the first.", "Third: ünïcödé too."]
EOS = 257  # byte-level tokenizer


def blocks(path: Path, seq: int, cache: Path, field: str = "text") -> tuple[list[int], list[int], object]:
    """(ids, labels) of every prepared block, flattened, and the dataset."""
    dataset = load_or_prepare(discover(str(path)), byte_level_tokenizer(), DataSpec(seq, field), cache)
    pairs = [dataset.block(i) for i in range(len(dataset))]
    return [t for ids, _ in pairs for t in ids.tolist()], [t for _, lab in pairs for t in lab.tolist()], dataset


def write_format(folder: Path, kind: str, texts: list[str] = TEXTS) -> Path:
    """TEXTS in one of the supported formats; returns the TRAIN_DATA path."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"text": t, "id": i} for i, t in enumerate(texts)]
    if kind == "txt":
        path = folder / "a.txt"
        path.write_text("\n".join(texts), encoding="utf-8")
    elif kind == "jsonl":
        path = folder / "a.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    elif kind == "json":
        path = folder / "a.json"
        path.write_text(json.dumps(rows), encoding="utf-8")
    elif kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = folder / "a.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif kind == "csv":
        import pandas as pd

        path = folder / "a.csv"
        pd.DataFrame(rows).to_csv(path, index=False)
    elif kind == "saved":
        from datasets import Dataset

        path = folder / "saved"
        Dataset.from_list(rows).save_to_disk(str(path))
    else:
        raise ValueError(kind)
    return path


def expected_stream(kind: str) -> list[int]:
    if kind == "txt":  # one document: the whole file, then EOS
        return [*"\n".join(TEXTS).encode(), EOS]
    return [tok for t in TEXTS for tok in [*t.encode(), EOS]]


FORMATS = ["txt", "jsonl", "json", "parquet", "csv", "saved"]


@pytest.mark.parametrize("kind", FORMATS)
def test_each_format_is_read_tokenized_and_packed(tmp_path: Path, kind: str) -> None:
    path = write_format(tmp_path, kind)
    seq = 16
    ids, labels, dataset = blocks(path, seq, tmp_path / "cache")
    stream = expected_stream(kind)
    n = len(stream) // seq
    assert len(dataset) == n
    assert ids == stream[: n * seq]
    assert labels == ids  # plain text: labels are the ids themselves


def test_folder_and_glob_collect_supported_files(tmp_path: Path) -> None:
    write_format(tmp_path / "d", "jsonl")
    write_format(tmp_path / "d" / "sub", "txt")
    (tmp_path / "d" / "notes.md").write_text("ignored")
    write_format(tmp_path / "d" / ".cache", "jsonl")  # hidden folders (an output cache, .git) are not data
    assert [p.name for p in discover(str(tmp_path / "d")).files] == ["a.jsonl", "a.txt"]
    assert [p.name for p in discover(str(tmp_path / "d" / "*.jsonl")).files] == ["a.jsonl"]


def test_prompt_completion_labels_mask_the_prompt(tmp_path: Path) -> None:
    """Each pair is one record, packed whole (TRAIN_PACKING=auto): prompt untrained, completion + EOS trained,
    padding (258) untrained, positions restarting at each record and at the padding."""
    pairs = [("Q: two plus two?\nA:", " four"), ("Say hi:", " hi there")]
    path = tmp_path / "pc.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "completion": c}) + "\n" for p, c in pairs))
    ids, labels, dataset = blocks(path, 32, tmp_path / "cache")
    want_ids, want_labels = [], []
    for p, c in pairs:  # 25 and 17 tokens: one sequence each
        record = [*p.encode(), *c.encode(), EOS]
        want_ids += record + [258] * (32 - len(record))
        want_labels += [-100] * len(p.encode()) + [*c.encode(), EOS] + [-100] * (32 - len(record))
    assert ids == want_ids
    assert labels == want_labels
    assert dataset[1]["position_ids"].tolist() == [*range(17), *range(15)]


def test_short_data_is_padded_into_one_masked_block(tmp_path: Path) -> None:
    path = tmp_path / "short.txt"
    path.write_text("abcd")
    _, _, dataset = blocks(path, 8, tmp_path / "cache")
    item = dataset[0]
    assert item["input_ids"].tolist() == [*b"abcd", EOS, 258, 258, 258]
    assert item["labels"].tolist() == [*b"abcd", EOS, -100, -100, -100]
    assert item["attention_mask"].tolist() == [1, 1, 1, 1, 1, 0, 0, 0]


def test_cache_is_reused_and_invalidated_by_a_changed_file(tmp_path: Path, caplog, monkeypatch) -> None:
    path = write_format(tmp_path / "d", "jsonl")
    first, _, _ = blocks(path, 8, tmp_path / "cache")
    calls = []
    real = shards.prepare
    monkeypatch.setattr(shards, "prepare", lambda *a, **k: calls.append(a) or real(*a, **k))
    with caplog.at_level(logging.INFO, logger="trainer"):
        again, _, _ = blocks(path, 8, tmp_path / "cache")
    assert calls == [] and "from the cache" in caplog.text
    assert first == again
    blocks(path, 16, tmp_path / "cache")  # another seq_len: another key
    assert len(calls) == 1
    path.write_text(path.read_text() + json.dumps({"text": "one more"}) + "\n")
    blocks(path, 8, tmp_path / "cache")
    assert len(calls) == 2


def test_missing_field_names_the_field_and_the_fix(tmp_path: Path) -> None:
    path = write_format(tmp_path, "parquet")
    with pytest.raises(ConfigError, match=r"no field 'body'.*TRAIN_TEXT_FIELD"):
        blocks(path, 8, tmp_path / "cache", field="body")
    assert "no field 'body'" in discover(str(write_format(tmp_path, "jsonl")), "body").problems[0]


def test_missing_default_path_means_embedded_corpus(monkeypatch, tmp_path: Path) -> None:
    missing = tmp_path / "data"
    monkeypatch.setattr(discovery, "DEFAULT_DATA", str(missing))
    source = discover(str(missing))
    assert source.embedded and source.files == (discovery.EMBEDDED_CORPUS,)
    assert discovery.EMBEDDED_CORPUS.stat().st_size > 50_000
    assert "no such file or folder" in discover(str(tmp_path / "elsewhere")).problems[0]


# ---- real training runs -------------------------------------------------------------------------------------------


# Two real runs cover every format: one folder holding a file of each kind and a save_to_disk folder. A run on
# prompt/completion is test_packing.py's resumed one, a run with no data at all (the embedded corpus)
# test_resume_safety.py's first. Each reader is checked token by token above.
FILE_FORMATS = ["txt", "jsonl", "json", "parquet", "csv"]
RUN_KINDS = ["mixed", "saved"]


def _prepare_run(tmp: Path, kind: str) -> dict[str, str]:
    out = tmp / kind / "out"
    if kind == "mixed":
        for fmt in FILE_FORMATS:
            write_format(tmp / kind / "data" / fmt, fmt, TEXTS * 20)
        return train_env(out, data=tmp / kind / "data", max_steps=1)
    return train_env(out, data=write_format(tmp / kind / "data", kind, TEXTS * 20), max_steps=1)


@pytest.fixture(scope="module")
def format_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, subprocess.CompletedProcess[str]]]:
    """One real `python -m trainer` run per format, started together (they are independent) to save wall time."""
    tmp = tmp_path_factory.mktemp("formats")
    procs = {}
    for kind in RUN_KINDS:
        env = _prepare_run(tmp, kind)
        procs[kind] = (
            Path(env["TRAIN_OUTPUT_DIR"]),
            subprocess.Popen(
                [sys.executable, "-m", "trainer"],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
    results = {}
    for kind, (out, proc) in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        results[kind] = (out, subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return results


def test_training_on_a_folder_with_every_file_format(format_runs) -> None:
    out, proc = format_runs["mixed"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tokenized 5 file(s)" in proc.stderr and (out / "final" / "model.safetensors").is_file()


def test_training_on_a_save_to_disk_folder(format_runs) -> None:
    out, proc = format_runs["saved"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tokenized datasets.save_to_disk folder" in proc.stderr and (out / "final" / "model.safetensors").is_file()
