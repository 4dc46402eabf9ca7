"""Data discovery has one definition (trainer.data.discovery): the checks, doctor and the run agree, and scan once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from trainer import config
from trainer.data.dataset import load_or_prepare
from trainer.data.discovery import discover
from trainer.doctor.probes import data_probe
from trainer.errors import ConfigError
from trainer.machine.hardware import Hardware
from trainer.tokenizer import byte_level_tokenizer

REPO = Path(__file__).resolve().parents[2]
CPU = Hardware(device="cpu", cpu_count=2, cxx_compiler="/usr/bin/g++")


@pytest.fixture
def dangling(tmp_path: Path) -> Path:
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "good.txt").write_text("some text\n" * 20)
    (folder / "gone.txt").symlink_to(tmp_path / "does-not-exist.txt")
    return folder


def test_a_dangling_symlink_is_the_same_problem_for_checks_doctor_and_the_run(dangling: Path, tmp_path: Path) -> None:
    """The old copies disagreed: config reported the link, the data loader skipped it and trained on the rest."""
    source = discover(str(dangling))
    assert [p.name for p in source.files] == ["gone.txt", "good.txt"]
    (problem,) = source.problems
    assert "gone.txt" in problem and "dangling symlink" in problem

    inputs = config.Inputs(config.parse_settings({"TRAIN_DATA": str(dangling), "TRAIN_OUTPUT_DIR": str(tmp_path)}))
    with pytest.raises(ConfigError) as checks:
        config.load_settings({"TRAIN_DATA": str(dangling), "TRAIN_OUTPUT_DIR": str(tmp_path / "out")})
    assert problem in checks.value.problems

    row = data_probe(inputs.data)
    assert row.status == "fail" and "gone.txt" in row.fix and row.value["readable"] is False

    with pytest.raises(ConfigError) as run:
        load_or_prepare(inputs.data, byte_level_tokenizer(), inputs.data_spec, tmp_path / "cache")
    assert run.value.problems == [problem]


def test_the_scan_travels_with_the_run_inputs_not_on_the_settings(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello\n")
    settings = config.parse_settings({"TRAIN_DATA": str(tmp_path), "TRAIN_OUTPUT_DIR": str(tmp_path / "out")})
    inputs = config.Inputs(settings)
    assert config.static_problems(inputs) == []
    first = inputs.data
    (tmp_path / "b.txt").write_text("a file added after the scan\n")
    cfg = config.resolve(inputs, CPU, environ={}, import_heavy=False)
    assert cfg.inputs.data is first and len(first.files) == 1  # the checks' scan, passed along to the run
    assert len(config.Inputs(settings).data.files) == 2  # a new run scans anew
    assert set(vars(settings)) <= set(type(settings).model_fields)  # nothing was kept on the settings object
    with pytest.raises(ValidationError):
        settings.data = "/elsewhere"  # frozen: a run's settings never change under it


def test_hub_style_folder_trains_on_the_train_split_and_names_the_rest(tmp_path: Path) -> None:
    data = tmp_path / "hub" / "data"
    data.mkdir(parents=True)
    for name in ("train-00000-of-00002.parquet", "train-00001-of-00002.parquet", "test-00000-of-00001.parquet"):
        (data / name).write_bytes(b"x")
    (tmp_path / "hub" / "README.md").write_text("card")
    source = discover(str(tmp_path / "hub"))
    assert [p.name for p in source.files] == ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]
    assert [p.name for p in source.left_out] == ["test-00000-of-00001.parquet"]
    assert "other splits left out" in source.describe() and "split 'train'" in source.reason


COUNT_SCANS = """
import json, sys
from trainer.data import discovery
calls = []
real = discovery._candidates
discovery._candidates = lambda *a: calls.append(a) or real(*a)
from trainer.__main__ import main
code = main(sys.argv[1:])
print(json.dumps({"scans": len(calls), "code": code}), file=sys.stderr)
"""


def _count_scans(args: list[str], env: dict[str, str]) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRAIN_")}
    result = subprocess.run(
        [sys.executable, "-c", COUNT_SCANS, *args],
        cwd=REPO,
        env={**base, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return json.loads(result.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("command", [["train"], ["doctor", "--json"]])
def test_one_run_scans_the_data_once(tmp_path: Path, command: list[str]) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "corpus.txt").write_text("hello world, a little corpus.\n" * 200)
    env = {
        "TRAIN_DATA": str(tmp_path / "data"),
        "TRAIN_OUTPUT_DIR": str(tmp_path / "out"),
        "TRAIN_SEQ_LEN": "32",
        "TRAIN_BATCH_SIZE": "2",
        "TRAIN_MAX_STEPS": "1",
    }
    assert _count_scans(command, env) == {"scans": 1, "code": 0}


def test_import_trainer_config_stays_light() -> None:
    code = "import sys, trainer.config; print([m for m in ('torch', 'numpy', 'pyarrow') if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_a_fifo_given_as_data_is_named_as_one(tmp_path: Path) -> None:
    """A named pipe exists but is no data file: the scan says what it is (not "no such file") and never opens it."""
    fifo = tmp_path / "stream.jsonl"
    os.mkfifo(fifo)
    found = discover(str(fifo))
    assert found.problems and "a named pipe (FIFO), not a data file" in found.problems[0]
    assert "no such file" not in found.problems[0]
    with pytest.raises(ConfigError) as checks:
        config.load_settings({"TRAIN_DATA": str(fifo), "TRAIN_OUTPUT_DIR": str(tmp_path / "out")})
    assert found.problems[0] in checks.value.problems
