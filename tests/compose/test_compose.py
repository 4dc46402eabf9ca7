"""`docker compose up train` on the CPU image: train, stop, resume, kill, finish; config errors; doctor."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import docker
import pytest
from compose_support import (
    GID,
    SECRET,
    TINY_SETTINGS,
    UID,
    Compose,
    assert_owned_by_user,
    assert_secret_absent,
    complete_checkpoints,
    global_step,
    secret_free_outputs,
    write_env,
)
from waiting import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]

MAX_STEPS = 24
SAVE_STEPS = 3


def set_env(folder: Path, **values: str) -> None:
    """Rewrite .env with the test's base values plus `values`."""
    current = dict(line.split("=", 1) for line in (folder / ".env").read_text().splitlines() if "=" in line)
    write_env(folder / ".env", {**current, **values})


def wait_until_exited(compose: Compose, timeout: float) -> dict:
    def exited():
        state = compose.state()
        return state if state["Status"] == "exited" and not state["Restarting"] else None

    return wait_for(exited, timeout, "the train container to exit", interval=0.2)


def resumed_from(logs: str) -> list[int]:
    """Checkpoint steps the trainer said it resumed from, in order."""
    return [int(step) for step in re.findall(r"[Rr]esum\w*[^\n]*?checkpoint-(\d+)", logs)]


def plant_interrupted_saves(output: Path, step: int) -> list[Path]:
    """What a kill during a save leaves behind: a temporary folder, and a folder without the completion marker."""
    debris = [output / f".tmp-checkpoint-{step}", output / f"checkpoint-{step + 1}"]
    for folder in debris:
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"partial")
        for path in (folder, folder / "model.safetensors"):
            os.chown(path, UID, GID)
    return debris


def kill_during_next_save(compose: Compose, output: Path, after: int) -> None:
    """`docker kill` as soon as a save after step `after` starts (or, if saves are too quick to catch, completes)."""
    container = compose.container()

    def save_started():
        temporary = [p for p in output.glob(".tmp-checkpoint-*") if int(p.name.rsplit("-", 1)[1]) > after]
        return temporary or [s for s in complete_checkpoints(output) if s > after]

    wait_for(save_started, 300, f"a save after step {after}", interval=0.01)
    container.kill()


def crash_trainer(container) -> None:
    """SIGKILL dumb-init's child, the trainer: the container exits 137 without anyone stopping it. The exec's own shell
    may end with it (137: the container's end takes every process in it); the restart the caller waits for is what
    shows the kill landed."""
    result = container.exec_run(["sh", "-c", "kill -9 $(cat /proc/1/task/1/children)"])
    assert result.exit_code in (0, 137), result.output


def test_up_stop_resume_kill_crash_and_finish(project):
    compose, folder = project
    output = folder / "output"
    set_env(folder, TRAIN_MAX_STEPS=str(MAX_STEPS), TRAIN_SAVE_STEPS=str(SAVE_STEPS))
    token = {"HF_TOKEN": SECRET}

    # 1. Train, then `docker compose stop` once a checkpoint exists: the trainer checkpoints and exits 143
    #    well within the grace period (60 s here), instead of being SIGKILLed (137) at its end.
    compose.run("up", "--detach", "train", env=token)
    wait_for(lambda: complete_checkpoints(output), 300, "a first checkpoint", interval=0.2)
    container = compose.container()
    assert SECRET not in json.dumps(container.labels)
    assert SECRET not in json.dumps(docker.from_env().api.inspect_image(container.image.id)["Config"])
    started = time.monotonic()
    compose.run("stop", "train")
    stop_seconds = time.monotonic() - started
    state = compose.state()
    logs = compose.logs()
    assert state["ExitCode"] == 143, logs
    assert stop_seconds < 60
    assert "interrupted" in logs
    stopped_at = complete_checkpoints(output)[-1]
    assert stopped_at < MAX_STEPS, "the run ended before the stop: raise MAX_STEPS"
    assert global_step(output / f"checkpoint-{stopped_at}") == stopped_at

    # 2. `up` again resumes from that step; `docker kill` it during its next save.
    compose.run("up", "--detach", "train", env=token)
    kill_during_next_save(compose, output, stopped_at)
    assert compose.state()["ExitCode"] == 137
    assert resumed_from(compose.logs())[-1] == stopped_at
    last_complete = complete_checkpoints(output)[-1]
    debris = plant_interrupted_saves(output, last_complete + 100)

    # 3. `up` again, nothing cleaned by hand: it resumes from the last complete checkpoint. Then the trainer
    #    crashes (SIGKILL, as the OOM killer would): Docker restarts the container by itself (bounded
    #    policy), it resumes from the newest checkpoint and finishes with an uninterrupted run's step count.
    compose.run("up", "--detach", "train", env=token)
    wait_for(lambda: complete_checkpoints(output)[-1] > last_complete, 300, "a checkpoint after the restart",
             interval=0.2)
    crash_trainer(compose.container())
    before_crash = complete_checkpoints(output)[-1]
    state = wait_until_exited(compose, 600)
    logs = compose.logs()
    assert state["ExitCode"] == 0, logs
    assert state["RestartCount"] == 1
    assert resumed_from(logs)[-2:] == [last_complete, before_crash]
    final_checkpoint = output / f"checkpoint-{complete_checkpoints(output)[-1]}"
    assert global_step(final_checkpoint) == MAX_STEPS
    steps = [json.loads(line)["step"] for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == MAX_STEPS
    assert (output / "final" / "config.json").exists()
    assert any((output / "final").glob("*.safetensors"))
    assert debris[1].name not in [f"checkpoint-{step}" for step in complete_checkpoints(output)]

    # Outputs belong to the user compose ran as; the token is nowhere to be read.
    assert_owned_by_user(output)
    assert_secret_absent(logs)
    secret_free_outputs(output)


def test_config_errors_exit_2_within_seconds_without_restart_loop(project):
    compose, folder = project

    # A bad value in .env: exit 2 with the trainer's message; the bounded restart policy gives up after 3 retries.
    set_env(folder, TRAIN_SEQ_LEN="sixty-four")
    compose.run("up", "train", timeout=300)
    state = compose.state()
    logs = compose.logs()
    assert state["ExitCode"] == 2, logs
    assert state["RestartCount"] == 3
    assert "TRAIN_SEQ_LEN" in logs and "error:" in logs
    assert "Traceback" not in logs
    assert seconds_running(state) < 15

    # A missing data mount (an explicit TRAIN_DATA that is not there): exit 2 too.
    set_env(folder, TRAIN_SEQ_LEN=TINY_SETTINGS["TRAIN_SEQ_LEN"])
    code, out, err = compose.run_once("train", options=("-e", "TRAIN_DATA=/data/missing.jsonl"))
    assert code == 2, out + err
    assert "TRAIN_DATA=/data/missing.jsonl" in out + err


def seconds_running(state: dict) -> float:
    from datetime import datetime

    def parse(stamp: str) -> datetime:
        return datetime.fromisoformat(re.sub(r"(\.\d{6})\d*", r"\1", stamp).replace("Z", "+00:00"))

    return (parse(state["FinishedAt"]) - parse(state["StartedAt"])).total_seconds()


def test_doctor_reports_json_and_fails_with_reasons(project, engine_memlock):
    compose, folder = project
    code, out, err = compose.run_once("doctor", "doctor", "--json")
    assert code == 0, out + err
    report = json.loads(out)
    for key in (
        "gpus", "driver", "cuda_runtime", "capability", "nccl", "torch", "apex", "deepspeed", "flash_attn",
        "bitsandbytes", "versions", "shm_bytes", "memlock", "user", "cache", "data", "output", "config",
    ):  # fmt: skip
        assert key in report, key
    assert report["ok"] is True and report["problems"] == []
    assert report["torch"]["build"] == "cpu"
    assert report["gpus"] == []
    assert report["memlock"] == ("unlimited" if engine_memlock == -1 else engine_memlock)  # the compose ulimit
    assert report["user"]["uid"] == UID
    assert report["data"]["readable"] is True and report["output"]["writable"] is True
    assert report["cache"]["writable"] is True  # the named volume, fresh, written by a non-root UID
    assert report["config"]["ok"] is True
    assert report["deepspeed"]["ops"], "DeepSpeed's ops are listed"

    # Will it fit? (issue 57) in the image, as `docker compose run --rm doctor doctor --memory` gives it.
    big = ("-e", "TRAIN_MODEL=1b", "-e", "TRAIN_BATCH_SIZE=64", "-e", "TRAIN_SEQ_LEN=4096")
    code, out, err = compose.run_once("doctor", "doctor", "--memory", "--json", "--gpu", "24GiB", options=big)
    assert code == 2, out + err
    memory = json.loads(out)
    assert memory["fits"] is False and sum(memory["parts"].values()) == memory["predicted_peak_bytes"]
    assert memory["changes"] and all(c["predicted_peak_bytes"] < 24 * 2**30 for c in memory["changes"])

    # Unwritable output and an impossible setting: non-zero, with one reason each.
    shutil.chown(folder / "output", 0, 0)
    code, out, _ = compose.run_once("doctor", "doctor", "--json", options=("-e", "TRAIN_ATTN=flash_attention_2"))
    report = json.loads(out)
    assert code == 2
    assert report["ok"] is False
    assert report["output"]["writable"] is False and report["config"]["ok"] is False
    assert any("Output" in problem for problem in report["problems"])
