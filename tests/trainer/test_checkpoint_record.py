"""trainer.checkpoint_record, the one home of a checkpoint's record, and the resume rule each TRAIN_* field declares
(in-process, on real folders; the runs that write and resume checkpoints are in test_resume*.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer import checkpoint_record as records
from trainer import config
from trainer.config import resume
from trainer.config.schema import OnResume, TrainSettings, resume_rule
from trainer.errors import ConfigError

TRAINER = Path(__file__).resolve().parents[2] / "trainer"


def test_only_the_record_module_names_the_checkpoint_files() -> None:
    home = TRAINER / "checkpoint_record.py"
    named = [
        f"{path.relative_to(TRAINER)}: {name}"
        for path in sorted(TRAINER.rglob("*.py"))
        if path != home
        for name in (records.COMPLETE_MARKER, records.STATE_FILE)
        if name in path.read_text()
    ]
    assert named == [], "ask trainer.checkpoint_record instead of naming its files"


def test_every_setting_declares_its_resume_rule() -> None:
    missing = []
    for name in TrainSettings.model_fields:
        try:
            resume_rule(name)
        except (KeyError, ValueError):
            missing.append(name)
    assert missing == [], "declare on_resume in trainer/config/schema/ for: " + ", ".join(missing)


def _checkpoint(root: Path, step: int, settings: TrainSettings) -> Path:
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / records.STATE_FILE).write_text(json.dumps({"global_step": step}))
    records.write_record(folder, resume.run_record(settings, {}), step)
    return folder


def test_a_changed_setting_is_treated_as_its_rule_says(tmp_path: Path) -> None:
    env = {"TRAIN_OUTPUT_DIR": str(tmp_path), "TRAIN_LOSS_ON": "assistant"}
    folder = _checkpoint(tmp_path, 2, config.parse_settings(env))
    changes = {"TRAIN_LORA": ("1", OnResume.FIXED), "TRAIN_LOSS_ON": ("all", OnResume.DATA),
               "TRAIN_LOG_STEPS": ("3", OnResume.FREE), "TRAIN_START_OVER": ("1", OnResume.NOT_RECORDED)}  # fmt: skip
    for variable, (value, rule) in changes.items():
        assert resume_rule(variable.removeprefix("TRAIN_").lower()) is rule
        changed = config.parse_settings({**env, variable: value})
        if rule is OnResume.FIXED:
            with pytest.raises(ConfigError, match=f"(?s){variable} was .*cannot continue"):
                resume.check_drift(folder, changed, quiet=True)
        elif rule is OnResume.DATA:
            with pytest.raises(ConfigError, match="TRAIN_RESUME_CHANGED_DATA=1"):
                resume.check_drift(folder, changed, quiet=True)
            allowed = config.parse_settings({**env, variable: value, "TRAIN_RESUME_CHANGED_DATA": "1"})
            resume.check_drift(folder, allowed, quiet=True)
        else:
            resume.check_drift(folder, changed, quiet=True)
    assert "start_over" not in records.read_record(folder).settings


def test_the_record_reads_back_and_damage_is_tolerated_once(tmp_path: Path) -> None:
    settings = config.parse_settings({"TRAIN_OUTPUT_DIR": str(tmp_path)})
    older, newer = _checkpoint(tmp_path, 2, settings), _checkpoint(tmp_path, 4, settings)
    record = records.read_record(newer)
    assert record.step == 4 and record.settings == resume.recorded_settings(settings) and not record.final
    assert set(record.files) == {records.STATE_FILE} and records.damage(newer) is None

    (newer / records.STATE_FILE).write_text(json.dumps({"global_step": 5}))  # same size, other bytes
    passed_over: list[tuple[Path, str]] = []
    assert records.newest_sound_checkpoint(tmp_path, lambda f, p: passed_over.append((f, p))) == older
    assert passed_over == [(newer, f"{newer / records.STATE_FILE} differs from what was saved (sha256)")]

    marker = older / records.COMPLETE_MARKER
    marker.write_text(json.dumps({"step": "two", "hub": ["x"], "trackers": {"wandb": "id"}, "settings": 1}))
    odd = records.read_record(older)
    assert (odd.step, odd.hub, odd.trackers, odd.settings, odd.files) == (None, {}, {}, None, None)
    assert records.damage(older) is None  # a record that lists no files (an older trainkit) is taken as it is
    for damaged in ("{not json", "[1, 2]", b"\xff\xfe"):
        marker.write_bytes(damaged if isinstance(damaged, bytes) else damaged.encode())
        assert records.read_record(older) is None
        assert records.damage(older) == f"its {records.COMPLETE_MARKER} marker is unreadable"
    assert records.newest_sound_checkpoint(tmp_path) is None
