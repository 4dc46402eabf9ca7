"""trainer.config.resume, the one home of resume decisions, on real checkpoint folders (in-process, no training: the
runs that write and resume from these folders are in test_resume.py and test_stop_signals.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer import checkpoint_record as records
from trainer import config
from trainer.config import resume
from trainer.config.schedule import resume_problems
from trainer.config.schema import TrainSettings
from trainer.errors import ConfigError
from trainer.machine.hardware import Hardware
from trainer.run.checkpoint import publish


def checkpoint(root: Path, step: int, *, marker: bool = True, hub: dict | None = None, batch: int = 4) -> Path:
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / records.STATE_FILE).write_text(json.dumps({"global_step": step, "train_batch_size": batch}))
    if marker:
        (folder / records.COMPLETE_MARKER).write_text(json.dumps({"step": step, "hub": hub or {}}))
    return folder


def settings(out: Path, mode: str) -> TrainSettings:
    return config.parse_settings({"TRAIN_OUTPUT_DIR": str(out), "TRAIN_RESUME": mode})


def test_auto_takes_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    checkpoint(tmp_path, 2)
    newest = checkpoint(tmp_path, 10)
    checkpoint(tmp_path, 12, marker=False)  # a partial save is never taken
    decided = resume.decide(settings(tmp_path, "auto"))
    assert decided.checkpoint == newest and decided.step == 10 and "newest complete" in decided.reason


def test_never_and_an_empty_output_start_from_scratch(tmp_path: Path) -> None:
    checkpoint(tmp_path, 2)  # an earlier run: never refuses it unless asked to start over (test_resume_safety.py)
    with pytest.raises(ConfigError, match="holds an earlier run"):
        resume.decide(settings(tmp_path, "never"))
    start_over = config.parse_settings({"TRAIN_OUTPUT_DIR": str(tmp_path), "TRAIN_RESUME": "never",
                                        "TRAIN_START_OVER": "1"})  # fmt: skip
    assert resume.decide(start_over).checkpoint is None
    empty = resume.decide(settings(tmp_path / "empty", "auto"))
    assert empty.checkpoint is None and empty.step == 0 and "starting from scratch" in empty.reason


def test_a_path_is_checked_before_the_run_continues(tmp_path: Path) -> None:
    partial = checkpoint(tmp_path, 3, marker=False)
    with pytest.raises(ConfigError, match=records.COMPLETE_MARKER):
        resume.decide(settings(tmp_path, str(partial)))
    stateless = tmp_path / "checkpoint-9"
    stateless.mkdir()
    with pytest.raises(ConfigError, match="not a checkpoint folder"):
        resume.decide(settings(tmp_path, str(stateless)))
    good = checkpoint(tmp_path, 5)
    assert resume.decide(settings(tmp_path, str(good))).checkpoint == good


def test_a_missing_folder_is_a_static_problem(tmp_path: Path) -> None:
    for mode in ("auto", "never", str(tmp_path)):
        assert resume_problems(settings(tmp_path, mode)) == []
    (problem,) = resume_problems(settings(tmp_path, str(tmp_path / "nope")))
    assert "no such checkpoint folder" in problem


def test_what_a_checkpoint_recorded(tmp_path: Path) -> None:
    commit = {"repo_id": "org/model", "sha": "a" * 40, "revision": "main"}
    folder = checkpoint(tmp_path, 7, hub={"model": commit, "junk": "not a record"}, batch=16)
    assert records.recorded_step(folder) == 7 and records.recorded_batch_size(folder) == 16
    assert records.read_record(folder).hub == {"model": commit}
    assert resume.hub_pins(settings(tmp_path, "auto")) == {"model": {**commit, "checkpoint": str(folder)}}
    assert resume.hub_pins(settings(tmp_path, "never")) == {}


def test_what_a_run_records_is_what_a_resume_reads_back(tmp_path: Path) -> None:
    commit = {"repo_id": "org/model", "revision": "main", "sha": "b" * 40}
    cfg = config.resolve(settings(tmp_path, "auto"), Hardware(device="cpu"), {}, import_heavy=False)
    assert resume.run_record(cfg.settings, cfg.hub).hub == {}  # no Hub ID: nothing to pin
    staged = tmp_path / ".tmp-checkpoint-4"
    staged.mkdir()
    (staged / records.STATE_FILE).write_text(json.dumps({"global_step": 4}))
    publish(staged, tmp_path / "checkpoint-4", resume.run_record(cfg.settings, {"model": commit}), 4)
    assert resume.decide(settings(tmp_path, "auto")).checkpoint == tmp_path / "checkpoint-4"
    assert records.read_record(tmp_path / "checkpoint-4").hub == {"model": commit}


def _published(root: Path, s: TrainSettings, batch: records.BatchRecord | None, step: int = 2) -> Path:
    staged = root / f".tmp-checkpoint-{step}"
    staged.mkdir(parents=True)
    (staged / records.STATE_FILE).write_text(json.dumps({"global_step": step}))
    publish(staged, root / f"checkpoint-{step}", resume.run_record(s, {}, batch), step)
    return root / f"checkpoint-{step}"


def _settings(out: Path, **train: str) -> TrainSettings:
    env = {"TRAIN_OUTPUT_DIR": str(out), "TRAIN_BATCH_SIZE": "2", **{f"TRAIN_{k.upper()}": v for k, v in train.items()}}
    return config.parse_settings(env)


def test_another_process_count_keeps_the_effective_batch_where_it_divides(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    two = _published(tmp_path, s, records.BatchRecord(2, 2, 1, samples_seen=0, step=0))  # 2 x 2 x 1 per step
    assert records.read_record(two).batch == records.BatchRecord(2, 2, 1, samples_seen=8, step=2)
    on_one = resume.continuation(two, s, processes=1, accumulation=1)
    assert (on_one.accumulation, on_one.reshard_from) == (2, 2) and on_one.batch.effective == 4
    assert "2 -> 1 process(es): accumulation 1 -> 2 keeps the effective batch" in on_one.note
    assert "8 sequences already trained (step 2)" in on_one.note
    same = resume.continuation(two, s, processes=2, accumulation=1)
    assert (same.accumulation, same.reshard_from, same.batch.samples_seen) == (1, None, 8)
    with pytest.raises(ConfigError, match=r"no whole accumulation keeps that \(4 is not a multiple of 8\)") as err:
        resume.continuation(two, s, processes=4, accumulation=1)
    assert "TRAIN_RESUME_CHANGED_DATA=1" in str(err.value)
    changed = _settings(tmp_path, resume_changed_data="1")
    assert resume.continuation(two, changed, processes=4, accumulation=1).accumulation == 1  # by steps, logged


def test_zero_nvme_state_and_an_unknown_process_count_are_refused(tmp_path: Path) -> None:
    nvme = _settings(tmp_path / "nvme", zero_stage="3", zero_offload="nvme")
    saved = _published(tmp_path / "nvme", nvme, records.BatchRecord(2, 2, 1, samples_seen=0, step=0))
    with pytest.raises(ConfigError, match="TRAIN_ZERO_OFFLOAD=nvme: DeepSpeed keeps each rank's offloaded"):
        resume.continuation(saved, nvme, processes=1, accumulation=1)
    older = _published(tmp_path / "older", _settings(tmp_path / "older", nproc_per_node="2"), None)
    with pytest.raises(ConfigError, match=r"recorded no batch \(an older trainkit\)"):
        resume.continuation(older, _settings(tmp_path / "older", nproc_per_node="1"), processes=1, accumulation=1)
    unchanged = resume.continuation(older, _settings(tmp_path / "older", nproc_per_node="2"), 2, 1)
    assert unchanged.reshard_from is None and unchanged.batch.samples_seen == 8
