"""Inputs that used to escape the error handling, with real files and real processes (trainer.data).

- a corrupt (not truncated) .gz: zlib.error, not an OSError, becomes a clear exit 2 naming the file;
- a JSON Lines line longer than MAX_LINE_BYTES: exit 2 naming the line, from the torch-free check (first line) and
  from the reader (a later line);
- a `**` glob through a symlink loop counts each real file once;
- the data cache checks its entries when it maps them: a truncated shard or a missing meta.json is rebuilt, and a
  same-size edit with its mtime restored is seen (content samples in the key).
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from pathlib import Path

from conftest import run_python
from test_data_cache import cache_dir, env_for, prepare_data

from trainer.data.formats import MAX_LINE_BYTES


def _prepare(tmp: Path, data: Path | str) -> tuple[int, str, str]:
    proc = prepare_data(env_for(tmp, Path(data)))
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


def _corrupt_gzip(path: Path) -> Path:
    """A .txt.gz with one byte flipped in its deflate stream where decompression fails with zlib.error."""
    text = "".join(f"Line {i}: some text about corrupt streams {i * 7}.\n" for i in range(20000)).encode()
    packed = gzip.compress(text, mtime=0)
    for offset in range(len(packed) // 2, len(packed)):
        broken = bytearray(packed)
        broken[offset] ^= 0xFF
        try:
            gzip.decompress(bytes(broken))
        except zlib.error:
            path.write_bytes(bytes(broken))
            return path
        except (OSError, EOFError):
            continue
    raise AssertionError("no offset gives a zlib.error")


def test_a_corrupt_gzip_is_a_clear_error(tmp_path: Path) -> None:
    data = _corrupt_gzip(tmp_path / "corpus.txt.gz")
    code, _, err = _prepare(tmp_path, data)
    assert code == 2, err[-3000:]
    assert f"{data}: cannot read (Error -3 while decompressing data" in err and "Traceback" not in err


def _long_line_file(path: Path, short_lines_before: int) -> Path:
    with open(path, "wb") as handle:
        handle.write(b'{"text": "a short record"}\n' * short_lines_before)
        handle.write(b'{"text": "' + b"x" * (MAX_LINE_BYTES + 1) + b'"}\n')
        handle.write(b'{"text": "after"}\n')
    return path


def test_a_line_over_the_limit_is_a_clear_error_in_the_check_and_in_the_reader(tmp_path: Path) -> None:
    first = _long_line_file(tmp_path / "first.jsonl", 0)
    done = run_python(["-m", "trainer", "config"], env={"TRAIN_DATA": str(first), "TRAIN_OUTPUT_DIR": str(tmp_path)})
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"{first}:1: a line longer than {MAX_LINE_BYTES >> 20} MiB" in done.stderr

    later = _long_line_file(tmp_path / "later.jsonl", 3)
    first.unlink()
    code, _, err = _prepare(tmp_path, later)
    assert code == 2, err[-3000:]
    assert f"{later}:4: a line longer than {MAX_LINE_BYTES >> 20} MiB" in err and "Traceback" not in err


def test_a_symlink_loop_under_a_recursive_glob_counts_each_file_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "sub" / "a.jsonl").write_text('{"text": "one record"}\n')
    (data / "sub" / "loop").symlink_to(data)  # data/sub/loop/sub/loop/... reaches a.jsonl again and again
    env = {"TRAIN_DATA": f"{data}/**/*.jsonl", "TRAIN_OUTPUT_DIR": str(tmp_path / "out")}
    done = run_python(["-m", "trainer", "config", "--json"], env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    reason = json.loads(done.stdout)["decisions"]["data"]["reason"]
    assert reason.startswith("1 data file(s)") and "are read once" in reason


def test_a_damaged_or_stale_cache_entry_is_prepared_again(tmp_path: Path) -> None:
    data = tmp_path / "corpus.jsonl"
    data.write_text("".join(json.dumps({"text": f"record {i}: some words to tokenize"}) + "\n" for i in range(3000)))
    code, out, err = _prepare(tmp_path, data)
    assert code == 0, err[-3000:]
    entry = Path(json.loads(out)["folder"])
    tokens = json.loads(out)["tokens"]

    shard = next(entry.glob("tokens-*.bin"))
    os.truncate(shard, shard.stat().st_size // 2)  # a shard cut short (a full disk, a bad copy)
    code, out, err = _prepare(tmp_path, data)
    assert code == 0, err[-3000:]
    assert f"the cache entry {entry} is damaged ({shard.name} has" in err and "tokenized" in err
    assert json.loads(out)["tokens"] == tokens

    (entry / "meta.json").unlink()  # a cache folder without meta.json must not break later runs
    code, out, err = _prepare(tmp_path, data)
    assert code == 0, err[-3000:]
    assert "no valid meta.json" in err and json.loads(out)["tokens"] == tokens

    stat = data.stat()
    data.write_text(data.read_text().replace("record 0:", "RECORD 0:"))  # same size
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the mtime restored
    code, out, err = _prepare(tmp_path, data)
    assert code == 0, err[-3000:]
    assert "tokenized" in err and Path(json.loads(out)["folder"]) != entry
    assert not list(cache_dir(tmp_path).glob(".tmp-*"))
