"""Resume refuses what would lose or mix work, with real `python -m trainer` runs on one folder (tiny preset):

- a changed setting the checkpoint cannot continue with (TRAIN_LORA) and a changed data setting (TRAIN_SEQ_LEN)
  exit 2 naming the variable and the fixes; a safe change (TRAIN_LOG_STEPS, TRAIN_MAX_STEPS) goes on with a log line;
- a truncated model.safetensors in the newest checkpoint: auto resume falls back to the previous checkpoint with a
  warning naming the file; a TRAIN_RESUME path without its optimizer.pt exits 2 naming it;
- TRAIN_RESUME=never in the used folder exits 2; with TRAIN_START_OVER=1 the earlier run moves to previous-runs/;
- every start's run_config.json is kept;
- with no TRAIN_DATA (and no /data) the first run trains on the embedded corpus and says so.
"""

from __future__ import annotations

import json
from pathlib import Path

from train_runs import finish, global_step, start, train_env

from trainer.checkpoint_record import COMPLETE_MARKER

NONEMPTY_DATA = Path("/data").exists() and any(Path("/data").iterdir())


def _run(out: Path, **train: object) -> tuple[int, str]:
    return finish(start(train_env(out, save_steps=2, **train)))


def test_resume_refuses_changed_runs_and_damaged_checkpoints(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, err = _run(out, max_steps=4)
    assert code == 0, err[-3000:]
    assert "EMBEDDED DEFAULT CORPUS" in err or NONEMPTY_DATA  # where /data holds files it is trained on instead
    recorded = json.loads((out / "checkpoint-4" / COMPLETE_MARKER).read_text())
    assert recorded["settings"]["seq_len"] == 32 and recorded["files"]["model.safetensors"]["size"] > 0

    code, err = _run(out, max_steps=6, lora=1)
    assert code == 2, err[-3000:]
    assert "TRAIN_LORA was False, now True" in err and "cannot continue with these changes" in err
    assert "TRAIN_RESUME=never with TRAIN_START_OVER=1" in err and "Traceback" not in err
    assert "output lock" not in err  # refused from the files alone, before torch and the lock

    code, err = _run(out, max_steps=6, seq_len=48)
    assert code == 2, err[-3000:]
    assert "TRAIN_SEQ_LEN was 32, now 48" in err and "TRAIN_RESUME_CHANGED_DATA=1" in err

    weights = out / "checkpoint-4" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    code, err = _run(out, max_steps=6, log_steps=2)
    assert code == 0, err[-3000:]
    assert f"{out / 'checkpoint-4'} is damaged ({weights} has" in err
    assert f"continuing from {out / 'checkpoint-2'}" in err
    assert "continuing with changed settings: TRAIN_LOG_STEPS was 1, now 2; TRAIN_MAX_STEPS was 4, now 6" in err
    assert global_step(out / "checkpoint-6") == 6

    (out / "checkpoint-6" / "optimizer.pt").unlink()
    code, err = _run(out, max_steps=8, resume=out / "checkpoint-6")
    assert code == 2, err[-3000:]
    assert f"the checkpoint is damaged: {out / 'checkpoint-6' / 'optimizer.pt'} is missing" in err

    code, err = _run(out, max_steps=2, resume="never")
    assert code == 2, err[-3000:]
    assert "holds an earlier run (checkpoint-2, checkpoint-4, checkpoint-6, final)" in err

    code, err = _run(out, max_steps=2, resume="never", start_over=1)
    assert code == 0, err[-3000:]
    (aside,) = (out / "previous-runs").iterdir()
    assert sorted(p.name for p in aside.iterdir()) == ["checkpoint-2", "checkpoint-4", "checkpoint-6", "final",
                                                       "metrics.jsonl"]  # fmt: skip
    assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-2"]
    assert len(list((out / "run_configs").glob("run_config-*.json"))) == 2  # the two earlier starts that trained
