"""`bench`'s rl_split row: an online RL step split into producing the completions and training on them, measured
by a real `python -m trainer bench` of GRPO on the tiny preset (CPU)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

from test_bench_cpu import REPO, bench_env

from trainer.bench.catalogue import RL_SPLIT, catalogue
from trainer.bench.runner import RunPlan
from trainer.bench.session import Bench, Context
from trainer.run.rollout_timing import GENERATION_KEY


def test_rl_split_splits_a_grpo_step_into_generation_and_training(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"say {w}:", "answer": "a"}) + "\n"
                               for w in ("cat", "sun", "red", "sky") * 8))  # fmt: skip
    env = bench_env(tmp_path, TRAIN_METHOD="grpo", TRAIN_DATA=str(prompts), TRAIN_REWARD="contains",
                    TRAIN_BATCH_SIZE="8", TRAIN_RL_GENERATIONS="4", TRAIN_RL_MAX_NEW_TOKENS="8")  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "trainer", "bench", "--rows", RL_SPLIT, "--steps", "1", "--warmup",
                           "1", "--json"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = {row["name"]: row for row in json.loads(proc.stdout)["rows"]}
    assert list(rows) == ["fp32", "auto", RL_SPLIT] and all(row["status"] == "ok" for row in rows.values())
    split = rows[RL_SPLIT]
    assert 0 < split["generation_s"] < split["step_time_s"], split
    assert "s generating and scoring the completions" in split["note"] and "s training" in split["note"]
    out = tmp_path / "output" / "bench"
    lines = [json.loads(line) for line in (out / "rows" / "fp32" / "metrics.jsonl").read_text().splitlines()]
    assert lines and all(line[GENERATION_KEY] > 0 for line in lines)
    with (out / "results.csv").open() as f:
        assert float(next(r for r in csv.DictReader(f) if r["name"] == RL_SPLIT)["generation_s"]) > 0


def test_rl_split_applies_to_online_rl_only() -> None:
    spec = next(row for row in catalogue() if row.name == RL_SPLIT)
    assert spec.env == {} and not spec.same_training  # the reference configuration, measured, never recommended
    plan = RunPlan(1, 1, 60, Path("/nonexistent"))
    reasons = {method: Bench([], Context("tiny", False, 64, 8, False, 64, method=method), plan, ui=None)
               .skip_reason(spec) for method in ("sft", "dpo", "grpo", "rloo")}  # fmt: skip
    assert "applies to online RL, not TRAIN_METHOD=sft; set TRAIN_METHOD=grpo or rloo" in reasons["sft"]
    assert reasons["dpo"] and reasons["grpo"] == reasons["rloo"] == ""
