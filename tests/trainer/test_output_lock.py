"""One run per output folder, with real `python -m trainer` processes on the tiny preset (trainer.output_lock).

- a second run on a busy folder exits 2 naming the holder, and writes nothing there;
- a kill -9 of the holder's main process alone (its DataLoader workers may linger a moment) does not block the
  restart: the restart takes the lock over with a log line and finishes.
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

from train_runs import finish, logged_steps, start, train_env
from waiting import wait_for

from trainer.output_lock import LOCK_NAME


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
