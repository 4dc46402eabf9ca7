"""Real `python -m trainer` runs on records with images: the tiny-vl shape learns the colour of held-out pictures
(one training run shared by the module), resumes bit-exactly after SIGTERM, exports a folder that reloads with its
processor and answers the same, refuses bad images before the model loads, and each family trains from its folder.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from conftest import run_trainer
from train_runs import assert_same_weights, finish, logged_steps, start, train_env
from vision_data import COLOURS, QUESTION, colour_data, colour_row, picture
from vision_families import save_family
from waiting import wait_for

STEPS = 120
LEARN = {"seq_len": 128, "batch_size": 8, "max_steps": STEPS, "lr": 0.003, "save_steps": 40, "log_steps": 20}


@pytest.fixture(scope="module")
def colours(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """64 training records; held-out pictures (other sizes and noise) asked the same question."""
    folder = tmp_path_factory.mktemp("colours")
    colour_data(folder, 64)
    rows = []
    for i, colour in enumerate(COLOURS):
        picture(folder / "held" / f"{colour}.png", colour, (50, 36), seed=900 + i)
        rows.append({**colour_row(f"held/{colour}.png", colour), "expected": colour})
    for row in rows:
        del row["messages"][1]  # the question only
    (folder / "held" / "blank.png").write_bytes(_blank())
    blank = [{"messages": [{"role": "user", "content": [{"type": "image", "image": "held/blank.png"},
                                                        {"type": "text", "text": QUESTION}]}], "expected": f"blank {c}"}
             for c in COLOURS]  # fmt: skip
    (folder / "held.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows + blank))
    scored = [colour_row(f"held/{colour}.png", colour) for colour in COLOURS]  # eval's: with the answers
    (folder / "held_eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in scored))
    return folder


def _blank() -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (50, 36), (128, 128, 128)).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def trained(colours: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("trained")
    code, err = finish(start(train_env(out, model="tiny-vl", data=colours / "train.jsonl", **LEARN)))
    assert code == 0, err[-3000:]
    return out, err


@pytest.fixture(scope="module")
def answers(trained: tuple[Path, str], colours: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """final/'s answers to the held-out and the blank pictures (`generate --input`)."""
    return _answers(trained[0], colours / "held.jsonl", tmp_path_factory.mktemp("answers") / "out.jsonl")


def _answers(model: Path, prompts: Path, out: Path) -> dict[str, str]:
    result = run_trainer(["generate", str(model), "--input", str(prompts), "--output", str(out)])
    assert result.returncode == 0, result.stderr[-3000:]
    return {json.loads(line)["expected"]: json.loads(line)["response"] for line in out.read_text().splitlines()}


def test_learns_the_colour_of_held_out_pictures(trained: tuple[Path, str], answers: dict[str, str]) -> None:
    """The same question, four held-out pictures, four right answers; a blank picture gets at most one of them;
    the component table came before step 0 (the tower frozen) and is in the run's record, and provenance.json hashed
    every picture."""
    out, log = trained
    assert {c: answers[c] for c in COLOURS} == {c: c for c in COLOURS}, answers
    assert sum(answers[f"blank {c}"] == c for c in COLOURS) <= 1, answers
    table = log[log.index("components:") : log.index("total", log.index("components:"))]
    assert " 0 (0.0%)" in table.split("vision tower")[1].splitlines()[0], table
    assert log.index("components:") < log.index("startup: ")  # logged when the first step ends
    recorded = {row["component"]: row for row in json.loads((out / "run_config.json").read_text())["components"]}
    assert recorded["vision tower"]["trainable"] == 0 < recorded["projector"]["trainable"], recorded
    data = json.loads((out / "provenance.json").read_text())["data"]
    assert sum(1 for path in data if path.endswith(".png")) == 64


def test_resume_after_sigterm_is_bit_exact(trained: tuple[Path, str], colours: Path, tmp_path: Path) -> None:
    """SIGTERM mid-run: a checkpoint, exit 143; the restart continues from it and ends with the uninterrupted
    run's weights, equal to the bit."""
    env = train_env(tmp_path, model="tiny-vl", data=colours / "train.jsonl", **LEARN)
    proc = start(env)
    wait_for(lambda: any(step >= 50 for step in logged_steps(tmp_path)), 600, "step 50", proc=proc)
    proc.send_signal(signal.SIGTERM)
    code, err = finish(proc)
    assert code == 143 and "interrupted by SIGTERM" in err, err[-3000:]
    code, err = finish(start(env))
    assert code == 0 and "continuing from" in err, err[-3000:]
    assert_same_weights(tmp_path / "final", trained[0] / "final")


def test_export_reloads_with_its_processor_and_answers_the_same(trained: tuple[Path, str], answers: dict[str, str],
                                                                colours: Path, tmp_path: Path) -> None:  # fmt: skip
    """The export reloads with its processor (verified on a picture) and `eval` of it on the held-out pictures
    answers as the run did (all four right), the loss taken on the answers, each picture named by its sha256."""
    import hashlib

    out = trained[0]
    result = run_trainer(["export", str(out), str(tmp_path / "export")])
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "export" / "processor_config.json").is_file()
    assert {c: answers[c] for c in COLOURS} == {c: c for c in COLOURS}
    scored = run_trainer(["eval", str(tmp_path / "export"), "--data", str(colours / "held_eval.jsonl"), "--output",
                          str(tmp_path / "eval")])  # fmt: skip
    assert scored.returncode == 0, scored.stderr[-3000:]
    results = json.loads((tmp_path / "eval" / "eval_results.json").read_text())
    assert results["exact_match"] == 1.0 and results["loss"] < 0.5 and results["images"]["count"] == 4, results
    records = [json.loads(line) for line in (tmp_path / "eval" / "records.jsonl").read_text().splitlines()]
    red = hashlib.sha256((colours / "held" / "red.png").read_bytes()).hexdigest()
    assert records[0]["images"] == [red] and records[0]["response"] == "red", records[0]


def test_data_show_marks_images_and_trained_tokens(colours: Path, tmp_path: Path) -> None:
    result = run_trainer(["data", "--show", "1", "--json"], env={"TRAIN_MODEL": "tiny-vl", "TRAIN_SEQ_LEN": "128",
                         "TRAIN_DATA": str(colours / "train.jsonl"), "TRAIN_OUTPUT_DIR": str(tmp_path)})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    shown = json.loads(result.stdout.splitlines()[-1])
    (image,) = shown["images"]
    start, tokens = image["first_token"], image["tokens"]
    assert 4 <= tokens <= 16 and all(label == -100 for label in shown["labels"][start : start + tokens]), shown
    trained = [i for i, label in zip(shown["input_ids"], shown["labels"], strict=True) if label != -100]
    assert bytes(t for t in trained if t < 256).decode() == "red\n", trained  # the answer and its end of turn


def test_bad_images_exit_2_before_the_model_loads(colours: Path, tmp_path: Path) -> None:
    rows = [colour_row(str(colours / "images" / "0-0.png"), "red"), colour_row("missing.png", "red"),
            colour_row("https://example.com/x.png", "red")]  # fmt: skip
    data = tmp_path / "data" / "train.jsonl"
    data.parent.mkdir()
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, err = finish(start(train_env(tmp_path / "out", model="tiny-vl", data=data)))
    assert code == 2, err[-3000:]
    assert "2 bad image record(s)" in err and f"{data}:2: image missing.png not found" in err, err[-2000:]
    assert f"{data}:3: images[1] is a URL" in err or f"{data}:3: messages[1] image is a URL" in err, err[-2000:]
    assert "model loaded" not in err and "Traceback" not in err


def test_refused_before_torch(colours: Path, tmp_path: Path) -> None:
    """A text-only model given records with images, packing them, and TRAIN_TRAINABLE without images: `config`
    exits 2 naming both sides, before torch loads."""
    data = colours / "train.jsonl"
    cases = [({"TRAIN_MODEL": "tiny"}, "is a text-only model (llama)"),
             ({"TRAIN_MODEL": "tiny-vl", "TRAIN_PACKING": "records"}, "TRAIN_PACKING=records with records with images "
                                                                        "(qwen2_vl): refused"),
             ({"TRAIN_MODEL": "tiny-vl", "TRAIN_TRAINABLE": "projector", "TRAIN_LORA": "1"}, "LoRA adapts the linears"),
             ({"TRAIN_MODEL": "tiny-vl", "TRAIN_TRAINABLE": "tower"}, "unknown part tower")]  # fmt: skip
    for env, said in cases:
        result = run_trainer(["config"], env={"TRAIN_DATA": str(data), "TRAIN_OUTPUT_DIR": str(tmp_path), **env})
        assert result.returncode == 2 and said in result.stderr and "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize("family", ["qwen2_5_vl", "gemma3", "idefics3", "llava"])
def test_each_family_trains_from_its_folder(family: str, colours: Path, tmp_path: Path) -> None:
    """A few steps from the family's folder: the loss falls on the answers only, the table shows the frozen tower,
    and final/ holds the processor."""
    folder = save_family(family, tmp_path / "model")
    code, err = finish(start(train_env(tmp_path / "out", model=folder, data=colours / "train.jsonl", seq_len=256,
                                       max_steps=3)))  # fmt: skip
    assert code == 0, err[-3000:]
    assert logged_steps(tmp_path / "out") == [1, 2, 3]
    assert "projector" in err and "vision tower" in err and "language model" in err
    assert (tmp_path / "out" / "final" / "processor_config.json").is_file()


def _losses(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {row["step"]: row["loss"] for row in rows if "loss" in row}


def test_two_processes_train_the_steps_one_process_accumulates(colours: Path, tmp_path: Path) -> None:
    """Two processes (torchrun over gloo) with batch 2 train, step by step, what one process with batch 2 and
    accumulation 2 trains: the same 4 records with their pictures a step, so the same losses within float reduction
    order; and both evaluate the held-out pictures during training (TRAIN_EVAL_DATA) to the same eval loss."""
    run = {"model": "tiny-vl", "data": colours / "train.jsonl", "seq_len": 128, "max_steps": 3, "eval_steps": 3,
           "eval_data": colours / "held_eval.jsonl"}  # fmt: skip
    code, err = finish(start(train_env(tmp_path / "one", grad_accum=2, **run), ("-m", "trainer.launch")))
    assert code == 0, err[-3000:]
    code, err = finish(start(train_env(tmp_path / "two", nproc_per_node=2, **run), ("-m", "trainer.launch")))
    assert code == 0, err[-3000:]
    assert "2 processes" in err, err[-3000:]
    one, two = _losses(tmp_path / "one"), _losses(tmp_path / "two")
    assert sorted(one) == sorted(two) == [1, 2, 3], (one, two)
    for step in one:
        assert abs(one[step] - two[step]) < 1e-3, (step, one, two)
    evals = [[json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()
              if "eval_loss" in line] for name in ("one", "two")]  # fmt: skip
    assert evals[0] and evals[1], evals
    assert abs(evals[0][-1]["eval_loss"] - evals[1][-1]["eval_loss"]) < 1e-3, evals
