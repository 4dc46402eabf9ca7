"""The run's record (trainer.config.run_record): written and read back as the same typed record, secrets masked; a
record of this layout before the DataSpec was written reads with the DataSpec its settings made; a damaged, older or
newer record is one message and exit 2 in every command that reads a run. The run's writes are counted in
test_startup_phases.py (two per run), on a real run."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from trainer import config
from trainer.config import run_record
from trainer.config.run_record import ComponentCount, RunRecord, Startup, TrainingData
from trainer.data.spec import DataSpec
from trainer.errors import ConfigError
from trainer.machine.hardware import Hardware

CPU = Hardware(device="cpu", cpu_count=2, cxx_compiler="/usr/bin/g++")
SECRET = "hf_abcdefghijklmnop"
UNREADABLE = "cannot be read as a run record"


def _record(**env: str) -> RunRecord:
    settings = config.parse_settings({"TRAIN_SEQ_LEN": "64", "TRAIN_LOSS_ON": "all", **env})
    cfg = config.resolve(settings, CPU, environ={}, import_heavy=False)
    return run_record.started(cfg, {"HF_TOKEN": SECRET, "TRAIN_SEQ_LEN": "64"})


def test_a_written_record_reads_back_as_the_same_typed_record(tmp_path: Path) -> None:
    learned = TrainingData(sequences=10, global_batch=4, left_out_per_epoch=2, left_out_tokens_per_epoch=128)
    record = _record(TRAIN_LR="0.01")
    table = (ComponentCount("routed experts", 64, 32, 16), ComponentCount("total", 80, 32, 32))
    record = dataclasses.replace(record, training_data=learned, startup=Startup(3.5, {"data": 1.0}, None),
                                 components=table)  # fmt: skip
    run_record.write(tmp_path, record)
    back = run_record.read(tmp_path)
    assert back is not None and back.to_dict() == record.to_dict()
    assert back.settings == record.settings and back.decisions == record.decisions
    assert back.set_by_env == record.set_by_env == {"seq_len", "loss_on", "lr"}  # not output_dir: parse's default
    assert back.data_spec == DataSpec(seq_len=64, loss_on="all") == record.data_spec
    assert back.training_data == learned and back.startup == Startup(3.5, {"data": 1.0}, None)
    assert back.components == table
    assert back.setting_values(user_set_only=True) == {"TRAIN_SEQ_LEN": 64, "TRAIN_LR": 0.01, "TRAIN_LOSS_ON": "all"}
    assert back.started_with() == {"TRAIN_SEQ_LEN": "64"}


def test_secrets_are_masked_in_the_file_and_in_what_the_record_hands_out(tmp_path: Path) -> None:
    record = _record(TRAIN_ARGS=f"--hub_token {SECRET}")
    assert record.environment["HF_TOKEN"] == SECRET  # in memory, as the run was given it
    written = run_record.write(tmp_path, record).read_text()
    assert SECRET not in written and SECRET not in json.dumps(record.setting_values())
    back = run_record.read(tmp_path)
    assert back.environment["HF_TOKEN"] == "***" and back.settings.args == "--hub_token ***"


def test_a_second_start_keeps_the_first_starts_record(tmp_path: Path) -> None:
    run_record.write_start(tmp_path, _record(TRAIN_LR="0.01"))
    run_record.write_start(tmp_path, _record(TRAIN_LR="0.02"))
    kept = list((tmp_path / run_record.ARCHIVE).glob("run_config-*.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text())["settings"]["TRAIN_LR"]["value"] == 0.01
    assert run_record.read(tmp_path).settings.lr == 0.02


def test_a_record_without_format_reads_with_the_data_spec_its_settings_made(tmp_path: Path) -> None:
    data = _record().to_dict()
    del data["format"], data["data_spec"]  # what the trainkit before the typed record wrote
    run_record.path(tmp_path).write_text(json.dumps(data))
    back = run_record.read(tmp_path)
    assert back.data_spec == DataSpec(seq_len=64, loss_on="all") and back.training_data is None


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda d: "{not json", "Expecting property name"),
        (lambda d: [], "the record is list"),
        (lambda d: {**d, "format": 99}, "format 99"),
        (lambda d: {k: v for k, v in d.items() if k != "decisions"}, "decisions is NoneType"),
        (lambda d: {**d, "decisions": {**d["decisions"], "retired": {"value": 1, "reason": "x"}}}, "unknown retired"),
        (lambda d: {**d, "settings": {**d["settings"], "TRAIN_GONE": {"value": 1}}}, "unknown variable TRAIN_GONE"),
        (lambda d: {**d, "settings": {**d["settings"], "TRAIN_LR": {"value": "fast"}}}, "TRAIN_LR='fast'"),
        (lambda d: {**d, "data_spec": {"seq_len": 64, "tokens": 1}}, "data_spec:"),
    ],
    ids=["not-json", "not-an-object", "newer", "older-no-decisions", "older-decision", "older-setting", "bad-value",
         "other-spec"],
)  # fmt: skip
def test_a_damaged_older_or_newer_record_is_one_message(tmp_path: Path, change, why: str) -> None:
    changed = change(_record().to_dict())
    run_record.path(tmp_path).write_text(changed if isinstance(changed, str) else json.dumps(changed))
    with pytest.raises(ConfigError) as info:
        run_record.read(tmp_path)
    message = info.value.message
    assert message.startswith(f"{tmp_path / 'run_config.json'} {UNREADABLE} (") and why in message
    assert f"{tmp_path / 'run_configs'}/" in message  # where each earlier start's copy is kept


def test_a_folder_without_a_record_reads_as_none_and_require_says_so(tmp_path: Path) -> None:
    assert run_record.read(tmp_path) is None
    with pytest.raises(ConfigError, match=f"diff {tmp_path}: no run_config.json in it"):
        run_record.require(tmp_path, "diff")


def test_every_command_that_reads_a_run_refuses_a_damaged_record_the_same_way(run_trainer, trainer_env, tmp_path
                                                                              ) -> None:  # fmt: skip
    """A hand-edited run_config.json that no longer parses: diff (which compared every setting as "(absent)" and
    exited 0), reproduce, export, generate and eval exit 2 with the one message naming it."""
    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    (run / "final" / "trainkit_complete").write_text("{}")
    (run / "provenance.json").write_text("{}")
    (run / "run_config.json").write_text('{"settings": {"TRAIN_LR": {"value": 0.01}, ')  # cut short by an editor
    data = tmp_path / "eval.jsonl"
    data.write_text(json.dumps({"prompt": "a", "completion": "b"}) + "\n")
    commands = {
        "diff": ["diff", run, run], "reproduce": ["reproduce", run], "export": ["export", run, tmp_path / "out"],
        "generate": ["generate", run], "eval": ["eval", run, "--data", data, "--output", tmp_path / "scores"],
    }  # fmt: skip
    for name, argv in commands.items():
        result = run_trainer([str(a) for a in argv], env=trainer_env, timeout=120)
        assert result.returncode == 2, (name, result.stdout[-2000:], result.stderr[-2000:])
        assert f"{run / 'run_config.json'} {UNREADABLE} (" in result.stderr, (name, result.stderr[-2000:])
        assert "Traceback" not in result.stderr, name
