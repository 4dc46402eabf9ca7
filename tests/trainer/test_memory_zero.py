"""Will it fit under ZeRO (issue 57): the predicted weights, gradients and optimizer state per process
(trainer/config/memory.py, DeepSpeed's layout in trainer/config/memory_zero.py) against the bytes two real DeepSpeed
processes hold, for ZeRO-1, 2 and 3.

One launch (the launcher's own torchrun command, `python -m trainer.launch --dry-run --json`, with the worker
tests/trainer/zero_held.py in place of `-m trainer train`) runs, in each of its two processes, the trainer's own run
of the tiny preset for one optimizer step at each stage in turn, with the DeepSpeed config the trainer generates
for TRAIN_ZERO_STAGE, on the CPU (gloo), in fp32 (what a CPU user gets) and bf16 (a GPU's default; DeepSpeed runs
it on the CPU too). The worker records per rank what
DeepSpeed holds: the weights (ZeRO-1/2's flat buffers, ZeRO-3's partitions and the small tensors it keeps whole),
the gradients it keeps for the step, the fp32 master partitions and the optimizer's state. Alignment padding is in
those bytes and in the prediction alike: they are equal, rank by rank. One bound: ZeRO-1's backward pass holds
gradients that its end reduces to the partition; the prediction counts every whole gradient there (an upper bound;
measured below it, and above what is held at the step).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from train_runs import REPO, finish, start, train_env, write_corpus

from trainer import config
from trainer.config.memory import Plan, predict, zero_ranks
from trainer.config.memory_fit import plan_of

STAGES = ("1", "2", "3")
RUNS = [(stage, precision) for precision in ("fp32", "bf16") for stage in STAGES]
RANKS = (0, 1)


def settings(out: Path, corpus: Path) -> dict[str, str]:
    return train_env(out, data=corpus, max_steps=1, nproc_per_node=2, max_restarts=0, zero_stage=STAGES[-1],
                     precision="fp32")  # fmt: skip


@pytest.fixture(scope="module")
def held(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What each rank held in each run, and the launch's seconds; one launch for all of them."""
    tmp = tmp_path_factory.mktemp("zero")
    env = {**settings(tmp / "out", write_corpus(tmp / "data.txt")), "ZERO_HELD_DIR": str(tmp),
           "ZERO_HELD_RUNS": ",".join(f"{stage}/{precision}" for stage, precision in RUNS)}  # fmt: skip
    dry = subprocess.run([sys.executable, "-m", "trainer.launch", "--dry-run", "--json"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert dry.returncode == 0, dry.stderr[-3000:]
    plan = json.loads(dry.stdout)
    command = plan["command"]
    assert command[-3:] == ["-m", "trainer", "train"], command
    started = time.monotonic()
    code, err = finish(start({**env, **plan["env"]}, [*command[1:-3], str(Path(__file__).with_name("zero_held.py"))]),
                       timeout=900)  # fmt: skip
    assert code == 0, err[-5000:]
    found = {run: {r: json.loads((tmp / f"zero{run[0]}-{run[1]}-rank{r}.json").read_text()) for r in RANKS}
             for run in RUNS}  # fmt: skip
    return {"ranks": found, "seconds": round(time.monotonic() - started, 1), "env": env}


def plan_for(stage: str, precision: str, env: dict[str, str]) -> Plan:
    train = {k: v for k, v in env.items() if k.startswith("TRAIN_")}
    cfg = config.resolve(config.parse_settings({**train, "TRAIN_ZERO_STAGE": stage, "TRAIN_PRECISION": precision}),
                         environ={})  # fmt: skip
    plan = plan_of(cfg)
    assert (plan.processes, plan.zero_stage, plan.precision) == (2, int(stage), precision)
    return plan


@pytest.mark.slow
@pytest.mark.parametrize(("stage", "precision"), RUNS, ids=lambda v: v)
def test_each_rank_holds_the_predicted_weights_gradients_and_optimizer_bytes(
    stage: str, precision: str, held: dict[str, Any]
) -> None:
    plan = plan_for(stage, precision, held["env"])
    layout = zero_ranks(plan)
    assert layout is not None
    c = plan.compute_bytes
    real = held["ranks"][(stage, precision)]
    figures = {}
    for rank in RANKS:
        r, h = real[rank], layout[rank]
        predicted = {"weights": h.weights * c, "gradients": h.gradients * c,
                     "optimizer": h.master * 4 + h.master * 8 + h.groups * 4}  # fmt: skip
        measured = {"weights": r["weights"], "gradients": r["gradients"],
                    "optimizer": r["master"] + r["optimizer_state"]}  # fmt: skip
        figures[rank] = (predicted, measured, round(r["seconds"], 1))
        assert r["optimizer_groups"] == h.groups, figures
        assert predicted == measured, figures
    print(f"ZeRO-{stage} {precision} per rank (predicted, measured bytes, seconds of its run): {figures}; "
          f"the launch of all stages {held['seconds']} s")
    parts = predict(plan).parts  # the worst rank's, per part
    assert parts["weights"] == max(real[rank]["weights"] for rank in RANKS)
    assert parts["optimizer"] == max(real[rank]["master"] + real[rank]["optimizer_state"] for rank in RANKS)
    if stage == "1":  # the backward pass's own peak, bounded (module docstring)
        at_step = max(real[rank]["gradients"] for rank in RANKS)
        backward = max(real[rank]["gradients_end_of_backward"] for rank in RANKS)
        assert at_step < backward <= parts["gradients"] == plan.shape.total() * c, (at_step, backward)
    else:
        assert parts["gradients"] == max(real[rank]["gradients"] for rank in RANKS)
        if stage == "2":
            assert all(real[rank]["gradients_end_of_backward"] == real[rank]["gradients"] for rank in RANKS)
