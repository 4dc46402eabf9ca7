"""Seconds to the first step (issue 27): every start-up phase is timed, logged in one line and recorded in
run_config.json; with torch.compile the compile time is reported apart from the first step's."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

from trainer.run.startup import STEPS_AFTER_FIRST, StartupCallback, StartupClock

PHASES = ["imports_and_config", "libraries", "data", "model", "trainer_setup", "first_step"]


def test_a_cpu_run_logs_and_records_its_start_up_phases(run_trainer, trainer_env, text_file) -> None:
    env = {**trainer_env, "TRAIN_DATA": str(text_file), "TRAIN_SEQ_LEN": "32", "TRAIN_BATCH_SIZE": "2",
           "TRAIN_MAX_STEPS": "2", "TRAIN_SAVE_STEPS": "100"}  # fmt: skip
    result = run_trainer([], env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    startup = json.loads((Path(env["TRAIN_OUTPUT_DIR"]) / "run_config.json").read_text())["startup"]
    assert list(startup["phases_s"]) == PHASES
    assert all(seconds >= 0 for seconds in startup["phases_s"].values())
    assert abs(sum(startup["phases_s"].values()) - startup["to_first_step_s"]) < 0.01
    assert 0 < startup["to_first_step_s"] < result.elapsed  # from the process's own start, within the run
    assert startup["phases_s"]["imports_and_config"] > 0.5  # the interpreter and torch: counted from process start
    assert startup["compile_s"] is None  # no torch.compile on CPU by default
    lines = [line for line in result.stderr.splitlines() if "startup: " in line]
    assert len(lines) == 1 and "from process start to the end of the first step (imports and config" in lines[0]


class _Config:
    """What the callback records into: a RunConfig's startup field and its writer."""

    def __init__(self, output_dir: Path) -> None:
        self.settings = SimpleNamespace(output_dir=str(output_dir))
        self.startup: dict = {}
        self.written = 0

    def write_run_config(self, folder: Path) -> None:
        self.written += 1


def test_the_compile_time_is_the_first_step_minus_a_normal_step(tmp_path: Path) -> None:
    clock = StartupClock(started=time.time())
    cfg = _Config(tmp_path)
    callback = StartupCallback(clock, cfg, compiled=True)
    args = SimpleNamespace(should_save=True)
    callback.on_train_begin(args, None, None)
    for step in range(1 + STEPS_AFTER_FIRST):
        callback.on_step_begin(args, None, None)
        time.sleep(0.6 if step == 0 else 0.05)  # the first step compiles
        callback.on_step_end(args, None, None)
    assert cfg.written == 1 and cfg.startup["phases_s"]["first_step"] >= 0.6
    assert 0.45 < cfg.startup["compile_s"] < 0.7  # 0.6 s first step less a 0.05 s normal step
    callback.on_step_end(args, None, None)
    assert cfg.written == 1  # once per run
