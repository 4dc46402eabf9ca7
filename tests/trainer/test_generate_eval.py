"""`python -m trainer generate` and `eval` on a real model: the tiny preset trained here (chatml template) until
greedy decoding gives back a fixed answer for each of four questions. Generation from final/ (a batch, prompts of
different lengths), from export's output and from the checkpoint (one prompt at a time, and the terminal chat) must
reproduce them, as the run's own samples at its last evaluation do (TRAIN_EVAL_GENERATE); eval scores 1.0 on its
own set, less on a set with the answers shuffled, its loss equals the training run's own eval loss on the same data,
and its summary reaches the run (evals.jsonl, its MLflow run, export's model card). Mistakes exit 2 before any
weights are read; SIGTERM leaves whole answer lines (generate) or no output folder (eval), exit 143."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PYTHON, REPO, base_env, run_python, run_trainer
from helpers import assert_user_error_in_process as _user_error
from memorize import MARGIN, MARGINS, MEMORIZE, PAIRS, chat_line, other_path, write_pairs
from waiting import wait_for
from wandb_files import wandb_records

from trainer.errors import EXIT_SIGTERM

STEPS = int(MEMORIZE["TRAIN_MAX_STEPS"])
OLDEST_PYTHON = REPO / ".venv-oldest" / "bin" / "python"


@pytest.fixture(scope="module")
def memorized(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run that memorized PAIRS, evaluated on them at its last step (metrics.jsonl's eval_loss) and answering
    them there (TRAIN_EVAL_GENERATE), tracked by TensorBoard, W&B (offline) and MLflow (its file store); final/
    exported to root/export."""
    root = tmp_path_factory.mktemp("memorized")
    write_pairs(root / "chat.jsonl")
    env = {**MEMORIZE, "HOME": str(root), "HF_HOME": str(root / "hf"), "TRAIN_OUTPUT_DIR": str(root / "out"),
           "TRAIN_DATA": str(root / "chat.jsonl"), "TRAIN_EVAL_DATA": str(root / "chat.jsonl"),
           "TRAIN_EVAL_GENERATE": "4", "TRAIN_REPORT_TO": "tensorboard,wandb,mlflow"}  # fmt: skip (W&B offline)
    result = run_trainer([], env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    result = run_trainer(["export", str(root / "out" / "final"), str(root / "export")], env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return root


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def margins(folder: Path, env: dict[str, str] | None = None) -> list[float]:
    """Each pair's margin in `folder`'s model (memorize.MARGINS), computed on the instruction path `env` names."""
    result = run_python(["-c", MARGINS, str(folder), json.dumps(PAIRS)], env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def test_the_answers_are_memorized_with_a_margin_on_this_and_the_other_instruction_path(
        memorized: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    """Every answer token beats the runner-up by MARGIN logits, teacher-forced: greedy decoding gives each answer
    back with room to spare, here and trained on the other instruction path (AVX2 on an AVX-512 machine; issue 59:
    the recipe tuned here memorized three pairs of four on an AVX2-only CPU). No tracker, eval or export: the
    cheapest run of the recipe."""
    monkeypatch.setattr(sys, "argv", ["-c", str(memorized / "out" / "final"), json.dumps(PAIRS)])
    exec(MARGINS, {})  # this process's instruction path is the one its children take by default: no interpreter more
    here = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    other = other_path()
    data = write_pairs(tmp_path / "chat.jsonl")
    env = {**MEMORIZE, **other, "HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf"),
           "TRAIN_OUTPUT_DIR": str(tmp_path / "out"), "TRAIN_DATA": str(data)}  # fmt: skip
    result = run_trainer([], env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    there = margins(tmp_path / "out" / "final", other)
    with capsys.disabled():
        print(f"margins here {[round(m, 3) for m in here]}, on {other} {[round(m, 3) for m in there]}")
    assert min(here) > MARGIN and min(there) > MARGIN, (here, there)


def test_generate_gives_back_the_trained_answers_batched_or_one_by_one(memorized: Path, tmp_path: Path) -> None:
    """From final/ batched (into --output in a folder that does not exist yet: made), from the checkpoint one by
    one and from export's output: the same answers."""
    prompts = tmp_path / "prompts.jsonl"
    rows = [{"id": i, "messages": [{"role": "user", "content": q}]} for i, (q, _) in enumerate(PAIRS)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    batched, single = tmp_path / "new" / "deeper" / "batched.jsonl", tmp_path / "single.jsonl"
    out = memorized / "out"
    result = run_trainer(["generate", str(out / "final"), "--input", str(prompts), "--output", str(batched)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tokens/s" in result.stderr and "memory: weights" in result.stderr
    assert f"made the folder {batched.parent}" in result.stderr
    answers = _lines(batched)
    assert [a["response"] for a in answers] == [a for _, a in PAIRS]
    assert [a["id"] for a in answers] == [0, 1, 2, 3] and all(a["messages"] for a in answers)  # input kept
    assert len({a["prompt_tokens"] for a in answers}) == 4  # four prompt lengths, left-padded together
    checkpoint = out / f"checkpoint-{STEPS}"
    result = run_trainer(["generate", str(checkpoint), "--input", str(prompts), "--output", str(single),
                          "--batch-size", "1"])  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert _lines(single) == answers  # same text, same token counts
    exported = tmp_path / "exported.jsonl"
    result = run_trainer(["generate", str(memorized / "export"), "--input", str(prompts), "--output", str(exported)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert _lines(exported) == answers  # export's output: the same tokens as final/


def test_eval_generate_answers_the_eval_set_at_each_evaluation(memorized: Path) -> None:
    """TRAIN_EVAL_GENERATE=4: at the run's evaluation (its last step) the answers are the memorized ones, in
    samples.jsonl (strict JSON) and TensorBoard's text tab."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = memorized / "out"
    rows = [json.loads(line, parse_constant=pytest.fail) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [(r["step"], r["where"]) for r in rows] == [(STEPS, f"{memorized / 'chat.jsonl'}:{n}") for n in range(1, 5)]
    assert [r["response"] for r in rows] == [r["reference"] for r in rows] == [a for _, a in PAIRS]
    assert rows[0]["messages"] == [{"role": "user", "content": PAIRS[0][0]}] and rows[0]["completion_tokens"] > 0
    (events,) = (out / "runs").rglob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events), size_guidance={"tensors": 0})
    accumulator.Reload()
    (text,) = accumulator.Tensors("eval/samples/text_summary")
    assert text.step == STEPS
    assert "| user: Who wrote Hamlet? | Shakespeare. | Shakespeare. |" in text.tensor_proto.string_val[0].decode()


def test_chat_keeps_history_until_reset_with_the_saved_template(memorized: Path) -> None:
    questions = f"{PAIRS[0][0]}\n/reset\n{PAIRS[2][0]}\n/exit\n{PAIRS[1][0]}\n"
    result = subprocess.run([PYTHON, "-m", "trainer", "generate", str(memorized / "out")], input=questions, cwd=REPO,
                            env=base_env(), capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == [PAIRS[0][1], PAIRS[2][1]]  # nothing after /exit
    assert "the model's chat template" in result.stderr and "(history cleared)" in result.stderr


def test_eval_scores_its_own_set_and_matches_the_runs_eval_loss(memorized: Path, tmp_path: Path) -> None:
    out = memorized / "out"
    result = run_trainer(["eval", str(out / "final"), "--data", str(memorized / "chat.jsonl"), "--output",
                          str(tmp_path / "own"), "--regex", "^[A-Z]"])  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    own = json.loads((tmp_path / "own" / "eval_results.json").read_text())
    assert own["exact_match"] == 1.0 and own["contains"] == 1.0 and own["regex"] == 1.0
    trained = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    run_loss = [m["eval_loss"] for m in trained if "eval_loss" in m][-1]
    assert own["loss"] == pytest.approx(run_loss, rel=1e-4)
    assert "exact_match" in result.stdout and "perplexity" in result.stdout
    _recorded_in_the_run(out, own)
    records = _lines(tmp_path / "own" / "records.jsonl")
    assert [r["where"] for r in records] == [f"{memorized / 'chat.jsonl'}:{n}" for n in range(1, 5)]
    shuffled = tmp_path / "shuffled.jsonl"
    answers = [a for _, a in PAIRS]
    shuffled.write_text("".join(chat_line(q, answers[i - 1]) + "\n" for i, (q, _) in enumerate(PAIRS)))
    result = run_trainer(["eval", str(out), "--data", str(shuffled), "--output", str(tmp_path / "other")])
    assert result.returncode == 0, result.stderr[-3000:]
    other = json.loads((tmp_path / "other" / "eval_results.json").read_text())
    # What the test controls: greedy decoding gives back every trained answer (exact_match 1.0 above), and each
    # shuffled answer starts with another byte than the question's own answer, so the model puts at most 1/2 on
    # each shuffled answer's first token: at least log(2) per pair in the summed loss. (A fixed margin over the own
    # set's loss is not implied: the training is bit-identical at any load, 0.1255 and 1.1221 on this stack, a gap of
    # 0.997 that the earlier `+ 1` missed.)
    assert other["exact_match"] == 0.0 and other["loss"] > own["loss"]
    assert other["loss"] * other["trained_tokens"] >= len(PAIRS) * math.log(2)
    assert not list(tmp_path.glob(".tmp-eval-*"))


def _recorded_in_the_run(out: Path, own: dict) -> None:
    """The summary of `eval final/` is in the run's evals.jsonl, its MLflow run (at the model's step) and the model
    card export writes for final/."""
    import os

    from mlflow.tracking import MlflowClient

    from trainer.export.model_card import model_card
    from trainer.export.source import resolve_source

    line = [json.loads(row) for row in (out / "evals.jsonl").read_text().splitlines()][-1]  # this test's eval
    assert line["folder"] == "final" and line["step"] == STEPS and line["metrics"]["exact_match"] == 1.0
    assert line["metrics"]["loss"] == own["loss"] and ["exact_match", "1.0000"] in line["rows"]
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    run_id = json.loads((out / "trackers.json").read_text())["trackers"]["mlflow"]["run_id"]
    history = MlflowClient((out / "mlruns").as_uri()).get_metric_history(run_id, "eval_results/exact_match")
    assert (STEPS, 1.0) in [(m.step, m.value) for m in history]
    wandb_id = json.loads((out / "trackers.json").read_text())["trackers"]["wandb"]["run_id"]
    halves = sorted((out / "wandb").glob(f"offline-run-*-{wandb_id}"))  # the training's, then each eval's
    summaries = {item.key: json.loads(item.value_json) for run in halves for record in wandb_records(run)
                 if record.WhichOneof("record_type") == "summary" for item in record.summary.update}  # fmt: skip
    assert summaries["eval_results/step"] == STEPS and summaries["eval_results/exact_match"] == 1.0
    card = model_card(resolve_source(out / "final"), "memorized", None, False)
    assert "## Evaluation" in card and "| exact_match | 1.0000 |" in card and f"| loss | {own['loss']:.4f} |" in card


def test_mistakes_exit_2_before_loading(memorized: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty-model"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    _user_error(["generate", str(empty)], capsys, f"generate {empty}: no model in it")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tmp_path / "gone")}))
    _user_error(["generate", str(adapter)], capsys, str(tmp_path / "gone"), "is not here",
                "give the base as MODEL and the adapter with --adapter")  # fmt: skip
    _user_error(["generate", str(memorized / "out"), "--adapter", str(empty)], capsys, "no adapter_config.json")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "fine"}\nnot json\n\n{"text": "no prompt"}\n{"prompt": "x", "response": "y"}\n')
    _user_error(["generate", str(memorized / "out"), "--input", str(prompts), "--output", str(tmp_path / "o.jsonl")],
                capsys, "3 bad line(s) of 4", f"{prompts}:2: ", f"{prompts}:4: no `prompt`", f"{prompts}:5: it holds "
                "response already", "--max-bad-lines")  # fmt: skip
    assert not (tmp_path / "o.jsonl").exists()
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("")
    _user_error(["eval", str(memorized / "out"), "--data", str(memorized / "chat.jsonl"), "--output",
                 str(tmp_path / "taken")], capsys, "not empty")  # fmt: skip


def test_empty_or_malformed_inputs_exit_2_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """generate --input and eval --data on files with nothing to answer or score, or records they cannot read: exit 2
    naming the file and what it takes, before any weights are read (MODEL is the tiny preset: no run needed)."""
    import logging

    monkeypatch.setattr(logging.getLogger("trainer"), "handlers", [])  # none left by an earlier in-process command
    pair = '{"prompt": "a", "chosen": "b", "rejected": "%s"}\n'  # the second pair below: chosen equals rejected
    texts = {"empty": "", "blank": "\n \n", "garbage": "not json\n", "fields": '{"foo": 1}\n',
             "pairs": pair % "c" + pair % "b"}  # fmt: skip
    files = {name: tmp_path / f"{name}.jsonl" for name in texts}
    for name, text in texts.items():
        files[name].write_text(text)
    scored = tmp_path / "eval"

    def generate(name: str) -> list[str]:  # each its own --output (and lock)
        return ["generate", "tiny", "--output", str(tmp_path / f"{name}-answers.jsonl"), "--input", str(files[name])]

    _user_error(generate("empty"), capsys, f"generate --input {files['empty']}: no prompt to answer (it is empty)",
                '{"prompt": ...}')  # fmt: skip
    _user_error(generate("blank"), capsys, "no prompt to answer (it holds only 2 blank line(s))")
    _user_error([*generate("garbage"), "--max-bad-lines", "1"], capsys,
                f"no prompt to answer (all 1 line(s) are bad, the first {files['garbage']}:1: ")  # fmt: skip
    assert not list(tmp_path.glob("*-answers.jsonl"))
    evaluate = ["eval", "tiny", "--output", str(scored), "--data"]
    _user_error([*evaluate, str(files["empty"])], capsys, f"eval --data={files['empty']}: no data found (its files "
                "are empty)")  # fmt: skip
    _user_error([*evaluate, str(files["blank"])], capsys, "holds only blank lines, no record to score",
                "or preference pairs (prompt/chosen/rejected)")  # fmt: skip
    _user_error([*evaluate, str(files["garbage"])], capsys, f"{files['garbage']}:1: not valid JSON",
                "TRAIN_DATA_MAX_BAD_LINES")  # fmt: skip
    _user_error([*evaluate, str(files["fields"])], capsys, "records have no field 'text' (they have: foo)")
    _user_error([*evaluate, str(files["pairs"])], capsys, f"eval --data: {files['pairs']}:2: chosen equals rejected")
    _user_error([*evaluate, str(files["pairs"]), "--regex", "x"], capsys, "--regex has nothing to match")
    assert not scored.exists() and not list(tmp_path.glob(".tmp-eval-*"))


def _refused(argv: list[str], *words: str) -> None:
    result = run_trainer(argv)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    for word in words:
        assert word in result.stderr, (word, result.stderr[-3000:])


def test_damaged_weights_or_pairs_exit_2(memorized: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """A truncated model.safetensors in final/ (its record knows the size) and in an export (no record: its header
    does not cover the file) exit 2 naming the file, for generate and eval; eval of KTO's labelled records says which
    layouts it takes (pairs it scores: test_preference). One real command; the other refusals, made before any
    weights are read, in this process."""
    import shutil

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q}]}) + "\n" for q, _ in PAIRS))
    for source, expected in ((memorized / "out" / "final", "the checkpoint was saved with"),
                             (memorized / "export", "is damaged")):  # fmt: skip
        damaged = tmp_path / f"damaged-{source.name}"
        shutil.copytree(source, damaged)
        weights = damaged / "model.safetensors"
        os.truncate(weights, weights.stat().st_size // 2)
        generate = ["generate", str(damaged), "--input", str(prompts), "--output", str(tmp_path / "o.jsonl")]
        if source.name == "final":  # the real command
            _refused(generate, str(weights), expected)
        else:
            _user_error(generate, capsys, str(weights), expected)
        _user_error(["eval", str(damaged), "--data", str(memorized / "chat.jsonl"), "--output", str(tmp_path / "e")],
                    capsys, str(weights), expected)  # fmt: skip
    labelled = tmp_path / "kto.jsonl"
    labelled.write_text(json.dumps({"prompt": PAIRS[0][0], "completion": PAIRS[0][1], "label": True}) + "\n")
    _user_error(["eval", str(memorized / "out"), "--data", str(labelled), "--output", str(tmp_path / "p")], capsys,
                "prompt/completion/label (KTO) records", "or preference pairs (prompt/chosen/rejected)",
                "not KTO's prompt/completion/label records")  # fmt: skip
    assert not (tmp_path / "e").exists() and not (tmp_path / "p").exists()


@pytest.mark.skipif(not OLDEST_PYTHON.exists(), reason="the oldest row's venv (tests/oldest/setup.sh) is not set up")
def test_quant_exits_2_where_bitsandbytes_cannot_run_it(tmp_path: Path) -> None:
    """The 12.1 row's bitsandbytes (0.45) has no CPU backend: on this machine --quant is refused before loading.
    (bitsandbytes 0.46+ quantizes on CPUs: there --quant runs; on GPUs: tests/gpu/test_generate_gpu.py.)"""
    argv = [str(OLDEST_PYTHON), "-m", "trainer", "generate", "tiny", "--quant", "4bit"]
    result = subprocess.run(argv, cwd=REPO, env=base_env(tmp_path), capture_output=True, text=True, timeout=300,
                            check=False)  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    assert "needs bitsandbytes 0.46+" in result.stderr and "Traceback" not in result.stderr


TASK_YAML = """task: trainkit_qa
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "<|im_start|>user\\n{{{{question}}}}<|im_end|>\\n<|im_start|>assistant\\n"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
target_delimiter: ""
metric_list:
  - metric: acc
"""


def test_lm_eval_task_from_local_files_runs_offline_and_a_missing_one_exits_2(
    memorized: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An lm-eval task of our own (local JSON Lines, the memorized questions with every answer as a choice) runs
    offline with --limit; `fetch --tasks` finds it in place; a task whose data was never fetched exits 2."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    answers = [a for _, a in PAIRS]
    rows = [{"question": q, "choices": answers, "label": i} for i, (q, _) in enumerate(PAIRS)]
    (tasks / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tasks / "trainkit_qa.yaml").write_text(TASK_YAML.format(data=tasks / "qa.jsonl"))
    env = {"HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf")}
    result = run_trainer(["eval", str(memorized / "out"), "--tasks", "trainkit_qa", "--include-path", str(tasks),
                          "--limit", "2", "--output", str(tmp_path / "tasks-eval")], env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    scored = json.loads((tmp_path / "tasks-eval" / "eval_results.json").read_text())["tasks"]["trainkit_qa"]
    assert scored["samples"] == 2 and scored["acc"] == 1.0  # the memorized answer is the likeliest choice
    result = run_trainer(["fetch", "--tasks", "trainkit_qa", "--include-path", str(tasks)], env=env)  # offline check
    assert result.returncode == 0, result.stderr[-3000:]
    assert "lm-eval tasks in the cache: trainkit_qa" in result.stdout
    for name, value in {**env, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}.items():
        monkeypatch.setenv(name, value)
    _user_error(
        ["eval", str(memorized / "out"), "--tasks", "arc_easy", "--output", str(tmp_path / "arc")],
        capsys,
        "lm-eval task 'arc_easy': its data is not in the cache",
        "python -m trainer fetch --tasks arc_easy",
    )
    _user_error(["eval", str(memorized / "out"), "--tasks", "no_such_task", "--output", str(tmp_path / "x")], capsys,
                "'no_such_task': unknown to lm-eval")  # fmt: skip


def _start(argv: list[str], err: Path) -> subprocess.Popen[str]:
    """`python -m trainer ARGV` in its own session, stderr to `err` (read while it runs)."""
    with err.open("w") as sink:  # the child keeps its own copy
        return subprocess.Popen([PYTHON, "-m", "trainer", *argv], cwd=REPO, env=base_env(), stdout=subprocess.DEVNULL,
                                stderr=sink, text=True, start_new_session=True)  # fmt: skip


def _stop(proc: subprocess.Popen[str]) -> int:
    os.killpg(proc.pid, signal.SIGTERM)  # as `docker stop` does: the whole group
    return proc.wait(timeout=120)


def test_sigterm_in_batch_generate_keeps_whole_lines_and_resume_finishes(memorized: Path, tmp_path: Path) -> None:
    prompts, out, err = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl", tmp_path / "err.txt"
    rows = [{"id": i, "messages": [{"role": "user", "content": PAIRS[i % 4][0]}]} for i in range(60)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["generate", str(memorized / "out" / "final"), "--input", str(prompts), "--output", str(out),
            "--batch-size", "1"]  # fmt: skip
    proc = _start(argv, err)
    wait_for(lambda: out.is_file() and out.read_text().count("\n") >= 2, 300, "two answers written", proc=proc)
    second = subprocess.run([PYTHON, "-m", "trainer", *argv, "--resume"], cwd=REPO, env=base_env(), text=True,
                            capture_output=True, timeout=300, check=False)  # fmt: skip: a second writer, meanwhile
    assert second.returncode == 2 and f"generate --output {out}: another generate is writing it" in second.stderr
    assert _stop(proc) == EXIT_SIGTERM, err.read_text()[-3000:]
    text = out.read_text()
    assert text.endswith("\n") and 2 <= len(_lines(out)) < 60  # whole lines only, and not all of them
    assert "--resume" in err.read_text() and "Traceback" not in err.read_text()
    result = run_trainer([*argv, "--resume"])
    assert result.returncode == 0, result.stderr[-3000:]
    answers = _lines(out)
    assert [a["id"] for a in answers] == list(range(60))  # none lost, none twice
    assert [a["response"] for a in answers] == [PAIRS[i % 4][1] for i in range(60)]


def test_sigterm_in_eval_publishes_nothing(memorized: Path, tmp_path: Path) -> None:
    data, err, target = tmp_path / "many.jsonl", tmp_path / "err.txt", tmp_path / "eval"
    data.write_text("".join(chat_line(q, a) + "\n" for q, a in PAIRS * 150))
    proc = _start(["eval", str(memorized / "out" / "final"), "--data", str(data), "--output", str(target)], err)
    wait_for(lambda: "eval: " in err.read_text() and " loaded (" in err.read_text(), 300, "the model loaded",
             proc=proc)  # fmt: skip: it answers 600 questions now
    second = subprocess.run([PYTHON, "-m", "trainer", "eval", str(memorized / "out"), "--data", str(data), "--output",
                             str(target)], cwd=REPO, env=base_env(), text=True, capture_output=True, timeout=300,
                            check=False)  # fmt: skip
    assert second.returncode == 2 and f"eval --output {target}: another eval is writing it" in second.stderr, (
        second.stderr[-3000:])  # fmt: skip
    assert _stop(proc) == EXIT_SIGTERM, err.read_text()[-3000:]
    assert not target.exists() and not list(tmp_path.glob(".tmp-eval-*"))
    assert "interrupted by SIGTERM" in err.read_text() and "Traceback" not in err.read_text()
