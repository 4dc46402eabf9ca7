"""Online RL (TRAIN_METHOD=grpo) on TRL's GRPOTrainer: real `python -m trainer` runs of the tiny preset with a user
reward file it can learn (the share of lower-case letters in its completions) and its sampled completions
(samples.jsonl, TensorBoard), a resume from that run's middle checkpoint (the same per-step rewards and samples as
the run it continues), `reproduce` of that run (the same per-step rewards
and losses; an edited reward file refused before training), reward functions that fail in training (exit 2,
named, no traceback, the last checkpoint kept), and the bad inputs, which end before torch (checked in-process,
one as a real subprocess)."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from conftest import REPO
from train_runs import assert_same_weights, finish, logged_steps, reproduce_with_edited, start, train_env
from waiting import wait_for

from trainer.checkpoint_record import newest_sound_checkpoint
from trainer.config.checks import static_problems
from trainer.config.inputs import Inputs
from trainer.config.parse import parse_settings
from trainer.errors import ConfigError

STEPS = 12
WORDS = ("cat", "sun", "red", "sky", "owl", "map", "ink", "oak")
REWARDS = '''
LETTERS = set("abcdefghijklmnopqrstuvwxyz")


def lowercase_share(prompts, completions, **columns):
    """The share of lower-case letters in each completion: a tiny model from scratch can learn it."""
    return [sum(ch in LETTERS for ch in c) / max(1, len(c)) for c in completions]


def flaky(prompts, completions, trainer_state, **columns):
    if trainer_state.global_step >= 1:
        raise ValueError("no score after the first step")
    return [0.0] * len(completions)


def not_a_number(prompts, completions, word, **columns):
    return [float("nan")] * len(word)


def wrong_arity(completions):
    return [0.0] * len(completions)


def needs_solution(prompts, completions, solution):
    return [0.0] * len(completions)


def hangs(prompts, completions, trainer_state, **columns):
    if trainer_state.global_step >= 2:
        import time

        time.sleep(3600)
    return [0.0] * len(completions)
'''


@pytest.fixture(scope="module", name="files")  # also test_online_rl_resume.py's (imported there)
def files_fixture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(prompts.jsonl: 32 text prompts with `word` and `answer` columns, an epoch of 8 steps; rewards.py)."""
    folder = tmp_path_factory.mktemp("rl")
    rows = [{"prompt": f"say {WORDS[i % len(WORDS)]}:", "word": WORDS[i % len(WORDS)], "answer": "a"}
            for i in range(32)]  # fmt: skip
    prompts = folder / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / "rewards.py").write_text(REWARDS)
    return prompts, folder / "rewards.py"


def grpo_env(out: Path, files: tuple[Path, Path], function: str, **more: object) -> dict[str, str]:
    """16 completions per step (4 prompts x 4), 8 new tokens each."""
    settings = {"method": "grpo", "data": files[0], "reward": f"{files[1]}:{function}", "batch_size": 16,
                "rl_generations": 4, "rl_max_new_tokens": 8, "lr": 2e-3, "max_steps": STEPS,
                "save_steps": STEPS // 2, **more}  # fmt: skip
    return train_env(out, **settings)


def rewards_of(out: Path) -> list[float]:
    return [json.loads(line)["reward"] for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def grpo_run(files: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("grpo") / "out"
    code, err = finish(start(grpo_env(out, files, "lowercase_share")))
    assert code == 0, err[-3000:]
    return out


def test_grpo_learns_the_reward_of_a_user_file(grpo_run: Path, files: tuple[Path, Path]) -> None:
    rewards = rewards_of(grpo_run)
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    print(f"reward per step: {[round(r, 3) for r in rewards]}; first 3 steps {first:.3f}, last 3 steps {last:.3f}")
    assert len(rewards) == STEPS and last > first + 0.1, rewards
    line = json.loads((grpo_run / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"reward", "reward_std", "rewards/lowercase_share/mean", "completions/mean_length"} <= set(line), line
    provenance = json.loads((grpo_run / "provenance.json").read_text())["online_rl"]
    assert provenance["reward_files"] == {
        str(files[1]): __import__("hashlib").sha256(files[1].read_bytes()).hexdigest()
    }
    assert provenance["generation"]["engine"] == "transformers" and provenance["generation"]["version"]
    decisions = json.loads((grpo_run / "run_config.json").read_text())["decisions"]
    assert decisions["method"]["value"] == "grpo" and "GRPOTrainer" in decisions["method"]["reason"]
    assert (grpo_run / "final" / "model.safetensors").is_file()


def test_sampled_completions_and_their_rewards_are_kept_per_step(grpo_run: Path) -> None:
    """samples.jsonl: the first 8 completions of each step (two prompts' groups of 4), each with its reward by name
    and the weighted total; TensorBoard's text tab holds the same table per step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    lines = (grpo_run / "samples.jsonl").read_text().splitlines()
    rows = [json.loads(line, parse_constant=pytest.fail) for line in lines]
    assert [r["step"] for r in rows] == [step for step in range(1, STEPS + 1) for _ in range(8)]
    assert {tuple(r) for r in rows} == {("step", "prompt", "completion", "rewards", "reward")}
    letters = set("abcdefghijklmnopqrstuvwxyz")
    for row in rows:
        share = sum(ch in letters for ch in row["completion"]) / max(1, len(row["completion"]))
        assert row["rewards"] == {"lowercase_share": pytest.approx(share)} and row["reward"] == pytest.approx(share)
    assert rows[0]["prompt"] == rows[3]["prompt"] != rows[4]["prompt"] and rows[0]["prompt"].startswith("say ")
    (events,) = (grpo_run / "runs").rglob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events), size_guidance={"tensors": 0})
    accumulator.Reload()
    texts = accumulator.Tensors("train/completions/text_summary")
    assert [t.step for t in texts] == list(range(1, STEPS + 1))
    assert "| step | prompt | completion | lowercase_share | reward |" in texts[0].tensor_proto.string_val[0].decode()


def test_a_stopped_run_resumes_to_the_same_rewards_and_weights(
    grpo_run: Path, files: tuple[Path, Path], tmp_path: Path
) -> None:
    """SIGTERM after step 3: a checkpoint, exit 143; the restart continues from it (the prompt order and the
    sampling state restored, across the epoch boundary at step 8) and gives the uninterrupted run's per-step rewards
    and final weights, bit for bit on the CPU."""
    out = tmp_path / "out"
    env = grpo_env(out, files, "lowercase_share")
    proc = start(env)
    wait_for(lambda: 3 in logged_steps(out), 300, "step 3", proc=proc)
    os.killpg(proc.pid, signal.SIGTERM)
    code, err = finish(proc)
    assert code == 143, err[-3000:]
    stopped = int(re.search(r"checkpoint-(\d+) written", err)[1])
    assert stopped < 8, stopped  # the resumed part crosses the epoch boundary
    code, err = finish(start(env))
    assert code == 0 and f"continuing from {out / f'checkpoint-{stopped}'}" in err, err[-3000:]
    assert rewards_of(out) == rewards_of(grpo_run)
    assert (out / "samples.jsonl").read_text() == (grpo_run / "samples.jsonl").read_text()  # no step twice
    assert_same_weights(out / "final", grpo_run / "final")


def test_reproduce_gives_the_same_rewards_and_losses_and_refuses_a_changed_reward_file(
    grpo_run: Path, files: tuple[Path, Path], tmp_path: Path, run_trainer
) -> None:
    """`reproduce` trains the recorded run again and compares each step's loss and reward: identical on the CPU.
    The reward file edited after the run: exit 2 naming it, before any training (no folder written)."""
    again = tmp_path / "again"
    result = run_trainer(["reproduce", str(grpo_run), "--output", str(again)], env={"PYTHONPATH": str(REPO)},
                         timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"reproduced: the loss and reward of all {STEPS} logged steps are identical" in result.stdout, result.stdout
    report = json.loads((again / "reproduce.json").read_text())
    assert report["identical"] is True and report["metrics"] == ["loss", "reward"], report
    assert rewards_of(again) == rewards_of(grpo_run) and len(rewards_of(again)) == STEPS
    from trainer.reproduce_command import first_difference

    other = {1: {"loss": 0.5, "reward": 0.25}, 2: {"loss": 0.5, "reward": 0.5}}  # the same loss, another reward
    assert first_difference({**other, 2: {"loss": 0.5, "reward": 0.75}}, other, [1, 2], exact=True) == {
        "step": 2, "metric": "reward", "original": 0.75, "again": 0.5
    }  # fmt: skip

    reward = files[1]
    refused = reproduce_with_edited(run_trainer, grpo_run, reward, tmp_path / "refused")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert f"the reward file {reward} changed" in refused.stderr and "--allow-changed-data" in refused.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again"]  # nothing staged: refused before training


def test_a_changed_reward_file_is_refused_on_resume(files: tuple[Path, Path], tmp_path: Path) -> None:
    from trainer import checkpoint_record
    from trainer.config.resume import check_drift, run_record

    reward = tmp_path / "rewards.py"
    reward.write_text(files[1].read_text())
    env = {"TRAIN_METHOD": "grpo", "TRAIN_REWARD": f"{reward}:lowercase_share"}
    settings = parse_settings(env)
    checkpoint = tmp_path / "checkpoint-6"
    checkpoint.mkdir()
    checkpoint_record.write_record(checkpoint, run_record(settings, {}), 6)
    check_drift(checkpoint, settings)  # unchanged: goes on
    reward.write_text(files[1].read_text() + "# changed\n")
    with pytest.raises(ConfigError) as caught:
        check_drift(checkpoint, settings)
    assert "TRAIN_REWARD was" in caught.value.message and "TRAIN_RESUME_CHANGED_DATA=1" in caught.value.message
    check_drift(checkpoint, parse_settings({**env, "TRAIN_RESUME_CHANGED_DATA": "1"}))  # allowed when asked


@pytest.mark.parametrize(
    ("function", "expected"),
    [("flaky", "reward function 'flaky' in {file} raised ValueError: no score after the first step (on the record at "
      "{data}:"),
     ("not_a_number", "reward function 'not_a_number' in {file} returned nan for the completion")],
    ids=["raises", "nan"],
)  # fmt: skip
def test_a_failing_reward_function_ends_the_run_named(
    function: str, expected: str, files: tuple[Path, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    code, err = finish(start(grpo_env(out, files, function, max_steps=3, save_steps=1)))
    assert code == 2 and "Traceback" not in err, err[-3000:]
    assert expected.format(file=files[1], data=files[0]) in err, err[-3000:]
    if function == "flaky":  # it failed in step 2: step 1's checkpoint stays, complete
        assert (out / "checkpoint-1" / "model.safetensors").is_file() and not (out / "checkpoint-2").exists()
    else:
        assert f"of the record at {files[0]}:" in err


def test_a_reward_function_that_takes_the_wrong_arguments_is_refused(files: tuple[Path, Path]) -> None:
    from trainer.config.online import rewards
    from trainer.run.rewards import build_rewards

    columns = frozenset({"word", "answer"})
    for function, expected in (("wrong_arity", "it takes no prompts"),
                               ("needs_solution", "parameters solution are neither TRL's arguments nor data columns"),
                               ("missing", "defines no 'missing'")):  # fmt: skip
        with pytest.raises(ConfigError) as caught:
            build_rewards(rewards(f"{files[1]}:{function}"), columns, 8)
        assert expected in caught.value.message or function == "missing", caught.value.message
    assert "exact" in [r.__name__ for r in build_rewards(rewards("exact,regex=^a:0.5,length"), columns, 8)][:1]


GOOD = {"prompt": "say hi", "answer": "hi"}


def problems(tmp_path: Path, rows: list, **env: str) -> str:
    data = tmp_path / "data.jsonl"
    data.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    settings = parse_settings({"TRAIN_DATA": str(data), "TRAIN_OUTPUT_DIR": str(tmp_path / "out"),
                               "TRAIN_METHOD": "grpo", "TRAIN_REWARD": "exact", "TRAIN_CHAT_TEMPLATE": "chatml",
                               "TRAIN_RL_GENERATIONS": "4", **env})  # fmt: skip
    return "\n".join(static_problems(Inputs(settings)))


def test_bad_prompts_and_settings_are_named_before_torch(tmp_path: Path, files: tuple[Path, Path]) -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}], "answer": "x"}
    assert problems(tmp_path, [chat, {"prompt": [{"role": "user", "content": "a"}], "answer": "y"}]) == ""
    assert "some prompts are text and some are messages" in problems(tmp_path, [GOOD, chat])
    assert "data.jsonl:2: no prompt (fields: answer, question)" in problems(
        tmp_path, [GOOD, {"question": "a", "answer": "b"}]
    )
    ends = problems(tmp_path, [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}])
    assert "data.jsonl:1: the conversation ends on a assistant turn" in ends, ends
    pairs = problems(tmp_path, [{"prompt": "a", "chosen": "b", "rejected": "c"}])
    assert "TRAIN_METHOD=grpo needs prompts" in pairs and "holds prompt/chosen/rejected" in pairs, pairs
    sft = problems(tmp_path, [{"prompt": "a", "completion": "b"}])
    assert "TRAIN_METHOD=grpo needs prompts" in sft and "holds prompt/completion" in sft, sft
    assert "holds prompts without answers" in problems(tmp_path, [GOOD], TRAIN_METHOD="sft", TRAIN_REWARD="")
    options = problems(tmp_path, [GOOD], TRAIN_METHOD="dpo", TRAIN_RL_GENERATIONS="4")
    assert "TRAIN_RL_GENERATIONS: for online RL (TRAIN_METHOD=grpo or rloo), not TRAIN_METHOD=dpo" in options
    assert "TRAIN_RL_LOSS applies to TRAIN_METHOD=grpo, not TRAIN_METHOD=rloo" in problems(
        tmp_path, [GOOD], TRAIN_METHOD="rloo", TRAIN_RL_LOSS="dr_grpo"
    )
    assert "is no multiple of TRAIN_RL_GENERATIONS=4" in problems(tmp_path, [GOOD], TRAIN_BATCH_SIZE="6")
    assert "has no vLLM installed" in problems(tmp_path, [GOOD], TRAIN_RL_ENGINE="vllm")
    assert "TRAIN_REWARD is empty" in problems(tmp_path, [GOOD], TRAIN_REWARD="")
    assert "no such file" in problems(tmp_path, [GOOD], TRAIN_REWARD=f"{tmp_path}/none.py:score")
    assert "defines no 'score'" in problems(tmp_path, [GOOD], TRAIN_REWARD=f"{files[1]}:score")
    assert "regex=[: the pattern does not compile" in problems(tmp_path, [GOOD], TRAIN_REWARD="regex=[")
    assert "did you mean num_generations?" in problems(tmp_path, [GOOD], TRAIN_ARGS="--num_generation 8")
    assert problems(tmp_path, [GOOD], TRAIN_ARGS="--top_p 0.9", TRAIN_REWARD=f"exact:2,{files[1]}:flaky:0.5") == ""


def test_pair_data_given_to_grpo_exits_2_before_torch(tmp_path: Path, run_trainer, imported_modules) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"prompt": "a", "chosen": "b", "rejected": "c"}) + "\n")
    env = {"TRAIN_DATA": str(data), "TRAIN_OUTPUT_DIR": str(tmp_path / "out"), "TRAIN_METHOD": "grpo",
           "TRAIN_REWARD": "exact"}  # fmt: skip
    result = run_trainer(["config"], env=env, python_args=["-X", "importtime"])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "TRAIN_METHOD=grpo needs prompts" in result.stderr and "torch" not in imported_modules(result.stderr)


def test_data_show_prints_the_prompts_as_rendered(tmp_path: Path, run_trainer) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"prompt": [{"role": "user", "content": "say hi"}], "answer": "hi"}) + "\n")
    env = {"TRAIN_DATA": str(data), "TRAIN_OUTPUT_DIR": str(tmp_path / "out"), "TRAIN_METHOD": "grpo",
           "TRAIN_REWARD": "exact", "TRAIN_CHAT_TEMPLATE": "chatml"}  # fmt: skip
    result = run_trainer(["data", "--show", "1"], env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "<|im_start|>user\nsay hi<|im_end|>\n<|im_start|>assistant\n" in result.stdout, result.stdout
    assert f"prompt 0 ({data}:1)" in result.stdout and '{"answer": "hi"}' in result.stdout


def test_a_mix_of_prompt_files_is_drawn_by_weight(tmp_path: Path, run_trainer) -> None:
    """TRAIN_DATA=a.jsonl:3,b.jsonl:1 with 4 prompts each: an epoch of 8 prompts, 6 of a (its 4 and 2 drawn again)
    and 2 of b (drawn from its 4 with TRAIN_SEED), each named by file:line; the shares are logged per source."""
    for name in ("a", "b"):
        rows = [{"prompt": f"{name} {i}", "answer": str(i)} for i in range(4)]
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    env = {"TRAIN_DATA": f"{tmp_path / 'a.jsonl'}:3,{tmp_path / 'b.jsonl'}:1", "TRAIN_METHOD": "grpo",
           "TRAIN_REWARD": "exact", "TRAIN_OUTPUT_DIR": str(tmp_path / "out")}  # fmt: skip
    result = run_trainer(["data", "--show", "8", "--json"], env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    shown = [json.loads(line) for line in result.stdout.splitlines()]
    files = [row["where"].rsplit(":", 1)[0] for row in shown]
    assert sorted(files) == [str(tmp_path / "a.jsonl")] * 6 + [str(tmp_path / "b.jsonl")] * 2, files
    assert sorted(row["text"] for row in shown if row["text"].startswith("a ")).count("a 0") >= 1
    logged = result.stderr
    assert "data mix: a (" in logged and "data mix: b (" in logged, logged[-3000:]
    assert "requested 75.00%, achieved 75.00% of 8 prompts; 6 records drawn from its 4, repeated 1.50 times" in logged
    assert "requested 25.00%, achieved 25.00% of 8 prompts; 2 records drawn from its 4, sampled 50.0% of its" in logged
    again = run_trainer(["data", "--show", "8", "--json"], env=env)
    assert again.stdout == result.stdout  # the same draw with the same TRAIN_SEED
    refused = problems(tmp_path, [GOOD], TRAIN_DATA=f"{tmp_path / 'a.jsonl'}:1,{tmp_path / 'a.jsonl'}:1")
    assert "is in the mix twice" in refused, refused
    assert "TRAIN_DATA mix also for grpo/rloo" in problems(tmp_path, [GOOD], TRAIN_METHOD="dpo",
                                                            TRAIN_DATA=env["TRAIN_DATA"])  # fmt: skip


def test_mistakes_of_issue_59_are_named_before_training(tmp_path: Path, files: tuple[Path, Path], grpo_run: Path
                                                        ) -> None:  # fmt: skip
    """Each exited 0 before: a reward's column that some record lacks (named by file:line, with the columns the
    records do have; a mix's second source too), a blank user turn, a causal LM given as the reward model."""
    lacking = problems(tmp_path, [{"prompt": "a"}, *[GOOD] * 7])
    assert f"exact reads each record's `answer`, which {tmp_path / 'data.jsonl'}:1 lacks (1 of 8 records" in lacking
    assert "the records' columns: answer)" in lacking, lacking
    word = problems(tmp_path, [{"prompt": "a", "word": "x"}, GOOD], TRAIN_REWARD=f"{files[1]}:not_a_number")
    assert f"not_a_number reads each record's `word`, which {tmp_path / 'data.jsonl'}:2 lacks" in word, word
    second = tmp_path / "second.jsonl"
    second.write_text(json.dumps({"prompt": "b", "solution": "y"}) + "\n")
    mix = problems(tmp_path, [GOOD], TRAIN_DATA=f"{files[0]}:1,{second}:1")
    assert f"which {second}:1 lacks (1 of 33 records of TRAIN_DATA" in mix and "answer, solution, word" in mix, mix
    system = {"role": "system", "content": "s"}
    for turns in ([{"role": "user", "content": ""}], [system, {"role": "user", "content": " "}]):
        blank = problems(tmp_path, [{"messages": turns, "answer": "x"}])
        assert f"data.jsonl:1: message {len(turns)}, the user's turn, is empty" in blank, blank
    causal = problems(tmp_path, [GOOD], TRAIN_REWARD=str(grpo_run / "final"))
    assert f"{grpo_run / 'final'} holds LlamaForCausalLM (a causal language model" in causal
    assert "not a sequence classifier with one score" in causal, causal


def test_a_changed_max_new_tokens_is_refused_on_resume(grpo_run: Path, files: tuple[Path, Path], tmp_path: Path
                                                       ) -> None:  # fmt: skip
    """The checkpoint records rl_max_new_tokens as it was (the secret rule masked it as *** for the TOKEN in its
    name, so a change resumed silently)."""
    from trainer.config.resume import decide

    env = grpo_env(tmp_path / "out", files, "lowercase_share", resume=grpo_run / "checkpoint-6", rl_max_new_tokens=12)
    with pytest.raises(ConfigError) as caught:
        decide(parse_settings({k: v for k, v in env.items() if k.startswith("TRAIN_")}))
    assert "TRAIN_RL_MAX_NEW_TOKENS was 8, now 12" in caught.value.message, caught.value.message


def test_prompts_past_the_context_and_qlora_on_the_cpu(files: tuple[Path, Path], tmp_path: Path) -> None:
    """A prompt of 2,300 tokens for the tiny preset's 2,048 positions: exit 2 naming its file:line before the model
    loads (it trained before, with only Transformers' notice); TRAIN_QUANT=4bit trains on the CPU (exit 1 before:
    the loader asked for GPU 0)."""
    long = tmp_path / "long.jsonl"
    long.write_text("".join(json.dumps({"prompt": p, "answer": "a"}) + "\n" for p in ("say a:", "x" * 2300, "say b:")))
    code, err = finish(start(grpo_env(tmp_path / "long", (long, files[1]), "lowercase_share", max_steps=1)))
    assert code == 2 and "Traceback" not in err, err[-3000:]
    assert f"the prompt at {long}:2 is 2300 tokens; with TRAIN_RL_MAX_NEW_TOKENS=8 it exceeds the model's context of " \
           "2048 tokens (1 of 3 prompts do" in err and "model loaded" not in err, err[-3000:]  # fmt: skip
    out = tmp_path / "qlora"
    code, err = finish(start(grpo_env(out, files, "lowercase_share", max_steps=1, quant="4bit", lora=1)))
    assert code == 0, err[-3000:]
    assert "4bit quantized on cpu" in err and logged_steps(out) == [1]


def test_a_reward_that_hangs_is_bounded_by_its_time_limit_and_by_a_stop(files: tuple[Path, Path], tmp_path: Path
                                                                       ) -> None:  # fmt: skip
    """A reward call past TRAIN_RL_REWARD_TIMEOUT fails as a raising one does (exit 2, named); SIGTERM while a reward
    hangs (in step 3) ends the run within the grace (it waited for the step forever before), exit 143, naming the
    reward, checkpoint-2 whole."""
    from trainer.config.online import rewards
    from trainer.run.rewards import STOP_GRACE_S, Reward, RewardFailed, _imported

    spec = rewards(f"{files[1]}:hangs").specs[0]
    reward = Reward(spec, _imported(spec), frozenset({"word", "answer"}), timeout=0.5)
    state = type("State", (), {"global_step": 2})()
    with pytest.raises(RewardFailed, match=r"'hangs' in .* did not return within TRAIN_RL_REWARD_TIMEOUT=0.5 s"):
        reward(["p"], ["c"], trainer_state=state, trainkit_record=["prompts.jsonl:1"])

    out = tmp_path / "out"
    proc = start(grpo_env(out, files, "hangs", max_steps=6, save_steps=1))
    wait_for(lambda: (out / "checkpoint-2").is_dir(), 600, "checkpoint-2", proc=proc)
    time.sleep(3)  # step 3: generating, then scoring with the reward that hangs
    os.killpg(proc.pid, signal.SIGTERM)
    began = time.monotonic()
    code, err = finish(proc, timeout=STOP_GRACE_S + 120)
    assert code == 143 and time.monotonic() - began < STOP_GRACE_S + 60, err[-3000:]
    assert f"reward function 'hangs' in {files[1]} did not return within 30 s of SIGTERM" in err, err[-3000:]
    assert newest_sound_checkpoint(out) == out / "checkpoint-2" and not (out / "checkpoint-3").exists()
