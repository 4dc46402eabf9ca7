"""One run per output folder, with real `python -m trainer` processes on the tiny preset (trainer.output_lock).

- a second run on a busy folder exits 2 naming the holder, and writes nothing there;
- a kill -9 of the holder's main process alone (its DataLoader workers may linger a moment) does not block the
  restart: the restart takes the lock over with a log line and finishes;
- a second run on a folder whose first run is held (SIGSTOP) between writing and rotating a checkpoint reads nothing
  in it before it asks for the lock (Python's audit events: every open and listing), then exits 2 naming the
  holder: a checkpoint the first run rotates away can never be read half-gone by the second (issue 59).
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

from train_runs import finish, logged_steps, start, train_env
from waiting import wait_for

from trainer.checkpoint_record import complete_checkpoints
from trainer.output_lock import LOCK_NAME

# `python -m trainer` with an audit hook printing each open and listing of a path under AUDITED (stderr, in order).
AUDITED_RUN = """
import os, runpy, sys
root = os.environ["AUDITED"]
def hook(event, args):
    if event in ("open", "os.listdir", "os.scandir") and args and isinstance(args[0], (str, os.PathLike)):
        path = os.fspath(args[0])
        if path.startswith(root):
            sys.stderr.write(f"AUDIT {event} {path}\\n")
sys.addaudithook(hook)
sys.argv = ["trainer"]
runpy.run_module("trainer", run_name="__main__")
"""


def test_a_second_run_on_a_busy_folder_exits_2_and_a_killed_holder_is_taken_over(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = start(train_env(out, max_steps=400))
    wait_for(lambda: 1 in logged_steps(out), 300, "step 1", proc=first)
    config_before = (out / "run_config.json").read_bytes()

    code, err = finish(start(train_env(out, max_steps=3, seed=8)))
    assert code == 2, err[-3000:]
    assert f"pid {first.pid} on host {socket.gethostname()}" in err and "in use by another run" in err
    assert "Traceback" not in err
    assert (out / "run_config.json").read_bytes() == config_before  # the second run wrote nothing
    assert first.poll() is None

    os.kill(first.pid, signal.SIGKILL)  # the main process only, as the OOM killer does
    first.communicate()
    code, err = finish(start(train_env(out, max_steps=3)))
    assert code == 0, err[-3000:]
    assert f"taking over {out / LOCK_NAME} from pid {first.pid}" in err
    assert (out / LOCK_NAME).read_text() == ""  # released at the end: nothing left to take over


def test_a_second_run_reads_nothing_in_a_busy_folder_before_it_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = start(train_env(out, max_steps=400, save_steps=1, save_total_limit=1))
    try:
        wait_for(lambda: complete_checkpoints(out), 300, "a checkpoint", proc=first)
        os.killpg(first.pid, signal.SIGSTOP)  # written, its rotation next: held whatever the load
        second = start({**train_env(out, max_steps=400), "AUDITED": str(out)}, ("-c", AUDITED_RUN))
        code, err = finish(second)
    finally:
        os.killpg(first.pid, signal.SIGCONT)
        os.killpg(first.pid, signal.SIGTERM)
        first.communicate(timeout=300)
    assert code == 2, err[-3000:]
    assert "in use by another run" in err and f"pid {first.pid}" in err and "Traceback" not in err
    seen = [line.split(" ", 2)[2] for line in err.splitlines() if line.startswith("AUDIT ")]
    assert seen and seen[0] == str(out / LOCK_NAME), seen[:5]  # the lock is the first thing it opens there
