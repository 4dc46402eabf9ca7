"""Will it fit under ZeRO (issue 57): the predicted weights, gradients and optimizer state per process
(trainer/memory/predict.py, DeepSpeed's layout in trainer/memory/zero.py) against the bytes two real DeepSpeed
processes hold, for ZeRO-1, 2 and 3.

One launch (the launcher's own torchrun command, `python -m trainer.launch --dry-run --json`, with the worker
tests/trainer/zero_held.py in place of `-m trainer train`) runs, in each of its two processes, the trainer's own run
for one optimizer step at each stage in turn, with the DeepSpeed config the trainer generates for TRAIN_ZERO_STAGE,
on the CPU (gloo): the tiny preset in fp32 (what a CPU user gets) and bf16 (a GPU's default; DeepSpeed runs it on
the CPU too), and a model folder of odd sizes in fp32. The worker records per rank what DeepSpeed holds: the
weights (ZeRO-1/2's flat buffers, ZeRO-3's partitions and the small tensors it keeps whole), the gradients it keeps
for the step, the fp32 master partitions and the optimizer's state. Alignment padding is in those bytes and in the
prediction alike: they are equal, rank by rank (the odd folder makes ZeRO-1/2 pad; ZeRO-3 pads only a tensor of
odd size, which a Llama with an even head size lacks over 2 processes). One bound: ZeRO-1's backward pass holds
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
from helpers import write_corpus
from train_runs import REPO, finish, start, train_env

from trainer import config
from trainer.memory.fit import plan_of
from trainer.memory.predict import Plan, predict, zero_ranks
from trainer.memory.zero import NCCL_ALIGNMENT

STAGES = ("1", "2", "3")
# (stage, precision, model): the tiny preset, and a model folder whose groups do not divide evenly (DeepSpeed pads)
RUNS = [(stage, precision, "tiny") for precision in ("fp32", "bf16") for stage in STAGES] + [
    (stage, "fp32", "odd") for stage in STAGES]  # fmt: skip
RANKS = (0, 1)


def odd_model(folder: Path) -> Path:
    """A 2-layer Llama of hidden 78 and intermediate 151 with the byte-level tokenizer (259 rows, as is): its weight
    group (139,542 values) and its norms (390) are not multiples of 2 x 2 processes, so ZeRO-1/2 pad both."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainer.tokenizer import byte_level_tokenizer

    tokenizer = byte_level_tokenizer()
    shape = LlamaConfig(vocab_size=len(tokenizer), hidden_size=78, intermediate_size=151, num_hidden_layers=2,
                        num_attention_heads=3, num_key_value_heads=3, tie_word_embeddings=True,
                        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    LlamaForCausalLM(shape).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def settings(out: Path, corpus: Path) -> dict[str, str]:
    return train_env(out, data=corpus, max_steps=1, nproc_per_node=2, max_restarts=0, zero_stage=STAGES[-1],
                     precision="fp32")  # fmt: skip


@pytest.fixture(scope="module")
def held(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What each rank held in each run, and the launch's seconds; one launch for all of them."""
    tmp = tmp_path_factory.mktemp("zero")
    models = {"tiny": "", "odd": "/" + str(odd_model(tmp / "odd"))}
    runs = ",".join(f"{stage}/{precision}{models[model]}" for stage, precision, model in RUNS)
    env = {**settings(tmp / "out", write_corpus(tmp / "data.txt")), "ZERO_HELD_DIR": str(tmp), "ZERO_HELD_RUNS": runs}
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
    found = {run: {r: json.loads((tmp / f"zero{run[0]}-{run[1]}{'-folder' if run[2] == 'odd' else ''}-rank{r}.json")
                                 .read_text()) for r in RANKS} for run in RUNS}  # fmt: skip
    return {"ranks": found, "seconds": round(time.monotonic() - started, 1), "env": env, "odd": str(tmp / "odd")}


def plan_for(stage: str, precision: str, model: str, held: dict[str, Any]) -> Plan:
    train = {k: v for k, v in held["env"].items() if k.startswith("TRAIN_")}
    train.update(TRAIN_ZERO_STAGE=stage, TRAIN_PRECISION=precision)
    if model == "odd":
        train["TRAIN_MODEL"] = held["odd"]
    cfg = config.resolve(config.parse_settings(train), environ={})
    plan = plan_of(cfg)
    assert (plan.processes, plan.zero_stage, plan.precision) == (2, int(stage), precision)
    return plan


@pytest.mark.slow
@pytest.mark.parametrize(("stage", "precision", "model"), RUNS, ids=lambda v: v)
def test_each_rank_holds_the_predicted_weights_gradients_and_optimizer_bytes(
    stage: str, precision: str, model: str, held: dict[str, Any]
) -> None:
    plan = plan_for(stage, precision, model, held)
    layout = zero_ranks(plan)
    assert layout is not None
    c = plan.compute_bytes
    real = held["ranks"][(stage, precision, model)]
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
    print(f"ZeRO-{stage} {precision} {model} per rank (predicted, measured bytes, seconds of its run): {figures}; "
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
        if stage == "2":  # the same through the backward pass, less the padding's zeros the step adds (< 2n a group)
            for rank in RANKS:
                added = real[rank]["gradients"] - real[rank]["gradients_end_of_backward"]
                assert 0 <= added < NCCL_ALIGNMENT * 2 * layout[rank].groups * c, (rank, added)
