"""Inputs real corpora come in: compressed files, hub-style dataset folders, JSON Lines with malformed lines.

Readers are checked token by token on the prepared shards; then real `python -m trainer` runs train a few steps of
the tiny preset on `.jsonl.gz`, `.jsonl.zst` and a hub-style parquet folder, and a malformed line stops a run with
its file and line number (exit 2), or is skipped and reported when TRAIN_DATA_MAX_BAD_LINES allows it.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard

from trainer.data.dataset import load_or_prepare
from trainer.data.discovery import discover
from trainer.data.spec import DataSpec
from trainer.errors import ConfigError
from trainer.tokenizer import byte_level_tokenizer

REPO = Path(__file__).resolve().parents[2]
TEXTS = [f"Record {i}: the quick brown fox jumps over the lazy dog, ünïcödé {i}." for i in range(200)]
EOS = 257
COMPRESSORS = {".gz": gzip.compress, ".zst": lambda b: zstandard.ZstdCompressor().compress(b), ".bz2": bz2.compress,
               ".xz": lzma.compress}  # fmt: skip


def jsonl_bytes(texts: list[str] = TEXTS) -> bytes:
    return "".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(texts)).encode()


def prepared_stream(path: Path, cache: Path, seq: int = 16, max_bad_lines: int = 0) -> list[int]:
    spec = DataSpec(seq, max_bad_lines=max_bad_lines)
    dataset = load_or_prepare(discover(str(path)), byte_level_tokenizer(), spec, cache)
    return [t for i in range(len(dataset)) for t in dataset.block(i)[0].tolist()]


def expected(texts: list[str], seq: int = 16) -> list[int]:
    stream = [tok for t in texts for tok in [*t.encode(), EOS]]
    return stream[: len(stream) // seq * seq]


@pytest.mark.parametrize("suffix", list(COMPRESSORS))
@pytest.mark.parametrize("fmt", ["jsonl", "json", "txt"])
def test_compressed_files_read_as_the_plain_ones(tmp_path: Path, fmt: str, suffix: str) -> None:
    plain = {"jsonl": jsonl_bytes(), "json": json.dumps([{"text": t} for t in TEXTS]).encode(),
             "txt": "\n".join(TEXTS).encode()}[fmt]  # fmt: skip
    (tmp_path / "p").mkdir()
    (tmp_path / "c").mkdir()
    (tmp_path / "p" / f"a.{fmt}").write_bytes(plain)
    (tmp_path / "c" / f"a.{fmt}{suffix}").write_bytes(COMPRESSORS[suffix](plain))
    want = prepared_stream(tmp_path / "p", tmp_path / "cache")
    assert prepared_stream(tmp_path / "c", tmp_path / "cache") == want
    if fmt != "txt":
        assert want == expected(TEXTS)


def test_a_truncated_gzip_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(gzip.compress(jsonl_bytes() * 50)[:-200])
    with pytest.raises(ConfigError, match=r"a\.jsonl\.gz: cannot read .*truncated or corrupt"):
        prepared_stream(path, tmp_path / "cache")


def write_hub_folder(root: Path, texts: list[str] = TEXTS) -> Path:
    """A dataset as `huggingface-cli download` leaves it: README, data/train-*.parquet shards, a test split."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "data").mkdir(parents=True)
    (root / "README.md").write_text("---\nconfigs: [{config_name: default}]\n---\n")
    half = len(texts) // 2
    for i, part in enumerate((texts[:half], texts[half:])):
        pq.write_table(pa.table({"text": part}), root / "data" / f"train-0000{i}-of-00002.parquet", row_group_size=7)
    pq.write_table(pa.table({"text": ["held out"] * 5}), root / "data" / "test-00000-of-00001.parquet")
    return root


def test_hub_style_folder_reads_the_train_split_in_order(tmp_path: Path) -> None:
    root = write_hub_folder(tmp_path / "hub")
    assert prepared_stream(root, tmp_path / "cache") == expected(TEXTS)


def test_arrow_files_are_read(tmp_path: Path) -> None:
    import pyarrow as pa

    table = pa.table({"text": TEXTS})
    (tmp_path / "d").mkdir()
    path = tmp_path / "d" / "data-00000-of-00001.arrow"  # the stream format `datasets` writes
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=13)
    assert prepared_stream(tmp_path / "d", tmp_path / "cache") == expected(TEXTS)


def with_bad_lines(path: Path) -> Path:
    lines = jsonl_bytes().decode().splitlines(keepends=True)
    lines[2] = '{"text": "broken record\n'  # line 3
    lines[150] = "[1, 2, 3]\n"  # line 151
    path.write_text("".join(lines))
    return path


def test_malformed_lines_are_named_and_bounded(tmp_path: Path) -> None:
    path = with_bad_lines(tmp_path / "bad.jsonl")
    with pytest.raises(ConfigError, match=rf"{path}:3: not valid JSON .*TRAIN_DATA_MAX_BAD_LINES"):
        prepared_stream(path, tmp_path / "cache")
    with pytest.raises(ConfigError, match=r"more than TRAIN_DATA_MAX_BAD_LINES=1 malformed lines .*bad\.jsonl:3"):
        prepared_stream(path, tmp_path / "cache", max_bad_lines=1)
    kept = [t for i, t in enumerate(TEXTS) if i not in (2, 150)]
    assert prepared_stream(path, tmp_path / "cache", max_bad_lines=2) == expected(kept)


# ---- real training runs ------------------------------------------------------------------------------------------


def run_env(tmp: Path, data: Path, **extra: str) -> dict[str, str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "TRAIN_DATA": str(data),
           "TRAIN_OUTPUT_DIR": str(tmp / "out"), "TRAIN_SEQ_LEN": "32", "TRAIN_BATCH_SIZE": "2",
           "TRAIN_MAX_STEPS": "3", "TRAIN_LOG_STEPS": "1"}  # fmt: skip
    return {**env, **extra}


def _runs(tmp: Path) -> dict[str, dict[str, str]]:
    folder = tmp / "compressed"  # one run reads both: corpus.jsonl.gz, corpus.jsonl.zst
    (folder / "data").mkdir(parents=True)
    for suffix in (".gz", ".zst"):
        (folder / "data" / f"corpus.jsonl{suffix}").write_bytes(COMPRESSORS[suffix](jsonl_bytes()))
    runs = {"compressed": run_env(folder, folder / "data")}
    hub = write_hub_folder(tmp / "hub" / "dataset")
    runs["hub"] = run_env(tmp / "hub", hub)
    (tmp / "bad").mkdir()
    runs["bad"] = run_env(tmp / "bad", with_bad_lines(tmp / "bad" / "corpus.jsonl"))
    (tmp / "bad_allowed").mkdir()
    bad = with_bad_lines(tmp / "bad_allowed" / "corpus.jsonl")
    runs["bad_allowed"] = run_env(tmp / "bad_allowed", bad, TRAIN_DATA_MAX_BAD_LINES="2")
    return runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, subprocess.CompletedProcess[str]]]:
    """One real `python -m trainer` per input, started together (they are independent) to save wall time."""
    procs = {
        name: (Path(env["TRAIN_OUTPUT_DIR"]), subprocess.Popen([sys.executable, "-m", "trainer"], cwd=REPO, env=env,
               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for name, env in _runs(tmp_path_factory.mktemp("inputs")).items()
    }  # fmt: skip
    results = {}
    for name, (out, proc) in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        results[name] = (out, subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return results


def _trained(out: Path, proc: subprocess.CompletedProcess[str]) -> list[float]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "final" / "model.safetensors").is_file()
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name", ["jsonl.gz", "jsonl.zst"])
def test_compressed_jsonl_trains(runs, name: str) -> None:
    """One run on a folder of both: each file's every record is prepared (the cache's count), and fingerprinted in
    provenance.json."""
    out, proc = runs["compressed"]
    assert len(_trained(out, proc)) == 3
    assert "2 file(s)" in proc.stderr
    (meta,) = (out / ".cache" / "data").glob("*/meta.json")
    assert json.loads(meta.read_text())["records"] == 2 * len(TEXTS)
    data = json.loads((out / "provenance.json").read_text())["data"]
    assert any(path.endswith(f"corpus.{name}") for path in data), data


def test_hub_style_parquet_folder_trains(runs) -> None:
    out, proc = runs["hub"]
    assert len(_trained(out, proc)) == 3
    assert "2 file(s); 1 file(s) of other splits left out" in proc.stderr


def test_a_malformed_line_stops_the_run_with_its_file_and_line(runs) -> None:
    _out, proc = runs["bad"]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "corpus.jsonl:3: not valid JSON" in proc.stderr and "TRAIN_DATA_MAX_BAD_LINES" in proc.stderr


def test_allowed_malformed_lines_are_skipped_and_reported(runs) -> None:
    out, proc = runs["bad_allowed"]
    assert len(_trained(out, proc)) == 3
    assert "skipped malformed line" in proc.stderr and "corpus.jsonl:3:" in proc.stderr
    assert "corpus.jsonl:151: expected a JSON object, got list" in proc.stderr
    assert "skipped 2 malformed line(s) (TRAIN_DATA_MAX_BAD_LINES=2)" in proc.stderr


def test_worker_processes_make_the_same_shards_as_one_process(tmp_path: Path, monkeypatch) -> None:
    """The byte-level path's worker pool (used on 4+ cores) keeps corpus order, masks and skipped lines."""
    from trainer.data import readers, shards

    monkeypatch.setattr(readers, "UNIT_BYTES", 4096)  # many units, so several are in flight at once
    path = with_bad_lines(tmp_path / "mixed.jsonl")
    with path.open("a") as handle:
        handle.writelines(json.dumps({"prompt": f"Q{i}?", "completion": f" A{i}."}) + "\n" for i in range(300))
    results = []
    for workers in (0, 2):
        folder = tmp_path / f"w{workers}"
        folder.mkdir()
        spec = DataSpec(16, max_bad_lines=2, workers=workers)
        meta = shards.prepare(discover(str(path)), byte_level_tokenizer(), spec, folder)
        files = [(folder / name).read_bytes() for name in ("tokens-00000.bin", "mask-00000.bin")]
        results.append((meta["workers"], meta["skipped_lines"], meta["tokens"], meta["has_mask"], *files))
    assert [r[0] for r in results] == [0, 2]
    assert results[0][1:] == results[1][1:]
    assert results[0][1] == [f"{path}:3: not valid JSON (Unterminated string starting at); each line must be one JSON "
                             "object", f"{path}:151: expected a JSON object, got list"]  # fmt: skip


def test_data_show_outside_the_image_caches_under_dot_output_and_says_so(tmp_path: Path) -> None:
    """No TRAIN_OUTPUT_DIR outside the image: ./output of the folder it starts in (not /output at the root), named
    in the log."""
    from conftest import run_trainer

    data = tmp_path / "d.jsonl"
    data.write_bytes(jsonl_bytes(TEXTS[:20]))
    env = {"TRAIN_DATA": str(data), "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    result = run_trainer(["data", "--show", "1"], env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"the output (and its data cache) go to {tmp_path / 'output'}" in result.stderr, result.stderr[-3000:]
    assert f"cached at {tmp_path / 'output' / '.cache' / 'data'}" in result.stderr, result.stderr[-3000:]
    assert "/output/.cache" not in result.stderr.replace(str(tmp_path / "output"), "")
