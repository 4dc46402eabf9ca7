"""Seconds to the first step (issue 27): every start-up phase is timed, logged in one line and recorded in
run_config.json; with torch.compile the compile time is reported apart from the first step's."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

from trainer.config import run_record
from trainer.run.startup import STEPS_AFTER_FIRST, StartupCallback, StartupClock

PHASES = ["imports_and_config", "libraries", "data", "model", "trainer_setup", "first_step"]


# Python's audit hook, loaded by the trainer process (sitecustomize): each publication of run_config.json (its
# writer renames a whole temporary file onto it) is one line of the log, and each import of a package a run without
# DeepSpeed, trackers and an adapter has no use for (trainer.library_patches: skip_deepspeed_import, skip_peft_import)
# is one line of another.
COUNT_RECORD_WRITES = """
import sys

def _count(event, args):
    if event == "os.rename" and str(args[1]).endswith("/run_config.json"):
        with open({log!r}, "a") as f:
            f.write(str(args[1]) + "\\n")
    if event == "import" and args[0] in ("deepspeed", "mlflow", "peft", "bitsandbytes"):
        with open({imports!r}, "a") as f:
            f.write(args[0] + "\\n")

sys.addaudithook(_count)
"""


def test_a_cpu_run_logs_and_records_its_start_up_phases(run_trainer, trainer_env, text_file, tmp_path) -> None:
    hook, writes, imports = tmp_path / "hook", tmp_path / "record-writes.log", tmp_path / "imports.log"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(COUNT_RECORD_WRITES.format(log=str(writes), imports=str(imports)))
    env = {**trainer_env, "TRAIN_DATA": str(text_file), "TRAIN_SEQ_LEN": "32", "TRAIN_BATCH_SIZE": "2",
           "TRAIN_MAX_STEPS": "2", "TRAIN_SAVE_STEPS": "100", "PYTHONPATH": str(hook)}  # fmt: skip
    result = run_trainer([], env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    out = Path(env["TRAIN_OUTPUT_DIR"])
    assert writes.read_text().splitlines() == [str(out / "run_config.json")] * 2  # at its start, and what it learned
    assert not imports.exists(), imports.read_text()  # accelerate's unwrap_model (1.5 CPU-s), Transformers' PEFT (0.9)
    record = run_record.read(out)
    assert record.training_data.sequences > 0 and record.data_spec.seq_len == 32 and record.startup is not None
    startup = json.loads((out / "run_config.json").read_text())["startup"]
    assert list(startup["phases_s"]) == PHASES
    assert all(seconds >= 0 for seconds in startup["phases_s"].values())
    assert abs(sum(startup["phases_s"].values()) - startup["to_first_step_s"]) < 0.01
    assert 0 < startup["to_first_step_s"] < result.elapsed  # from the process's own start, within the run
    assert startup["phases_s"]["imports_and_config"] > 0.5  # the interpreter and torch: counted from process start
    assert startup["compile_s"] is None  # no torch.compile on CPU by default
    lines = [line for line in result.stderr.splitlines() if "startup: " in line]
    assert len(lines) == 1 and "from process start to the end of the first step (imports and config" in lines[0]


def test_the_compile_time_is_the_first_step_minus_a_normal_step() -> None:
    clock = StartupClock(started=time.time())
    reported: list = []
    callback = StartupCallback(clock, reported.append, compiled=True)
    args = SimpleNamespace(should_save=True)
    callback.on_train_begin(args, None, None)
    for step in range(1 + STEPS_AFTER_FIRST):
        callback.on_step_begin(args, None, None)
        time.sleep(0.6 if step == 0 else 0.05)  # the first step compiles
        callback.on_step_end(args, None, None)
    assert len(reported) == 1 and reported[0].phases_s["first_step"] >= 0.6
    assert 0.45 < reported[0].compile_s < 0.7  # 0.6 s first step less a 0.05 s normal step
    callback.on_step_end(args, None, None)
    callback.on_train_end(args, None, None)
    assert len(reported) == 1  # once per run


def test_a_run_that_trains_no_step_reports_once_without_phases() -> None:
    reported: list = []
    callback = StartupCallback(StartupClock(started=time.time()), reported.append, compiled=False)
    args = SimpleNamespace(should_save=True)
    callback.on_train_begin(args, None, None)
    callback.on_train_end(args, None, None)
    callback.on_train_end(args, None, None)
    assert reported == [None]


HIDDEN_THEN_ADAPTER = """
from trainer.library_patches import skip_peft_import
skip_peft_import(uses_peft=False)
import transformers.trainer_utils
import sys
print("peft" in sys.modules)
try:
    skip_peft_import(uses_peft=True)
except RuntimeError as exc:
    print(exc)
"""


def test_an_adapter_after_peft_was_hidden_in_the_same_process_is_refused(run_python) -> None:
    """Transformers' trainer modules imported with PEFT hidden would take an adapter for a plain model (and save it
    whole): a later adapter run in that process is refused, not trained."""
    result = run_python(["-c", HIDDEN_THEN_ADAPTER])
    assert result.returncode == 0, result.stderr[-3000:]
    imported, refusal = result.stdout.splitlines()
    assert imported == "False"  # hidden: trainer_utils did not import it
    assert "transformers.trainer_utils imported with PEFT hidden" in refusal and "new process" in refusal
