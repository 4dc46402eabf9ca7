"""Multi-turn GRPO for real (`python -m trainer`, the Transformers engine): the tiny preset taught the lookup task's
format (tests/trainer/tool_task.py: SFT on tool transcripts with a local BPE tokenizer and the built-in chatml, one
run shared), then GRPO with TRAIN_RL_TOOLS, whose reward (a lookup in the episode) only the tool can give: it rises,
and the same run without the tool gets none; each step's turns and tool calls in metrics.jsonl, each turn in the
samples; SIGTERM while a tool call runs checkpoints that step and the restart trains as the uninterrupted run did;
`reproduce` gives the same rewards and refuses an edited tool file; named environments chosen by the records; a chat
template without tools refused before the model loads."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest
from conftest import REPO
from tool_task import write_task
from train_runs import assert_same_weights, finish, logged_steps, reproduce_with_edited, start, train_env
from waiting import wait_for

STEPS = 12
RISE = 0.12  # half the smallest rise measured, last 4 steps over the first 4 (test_grpo_learns_... says which)


@pytest.fixture(scope="module", name="task")  # also test_vllm_tools.py's (imported there)
def task_fixture(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_task(tmp_path_factory.mktemp("lookup"))


@pytest.fixture(scope="module", name="taught")  # also test_vllm_tools.py's
def taught_fixture(task: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny preset after 80 SFT steps on the task's transcripts: half call the tool, half guess an answer."""
    out = tmp_path_factory.mktemp("taught") / "sft"
    env = train_env(out, data=task["sft.jsonl"], tokenizer=task["tokenizer"], chat_template="chatml", seq_len=64,
                    batch_size=8, max_steps=80, lr=3e-3)  # fmt: skip
    code, err = finish(start(env), 900)
    assert code == 0, err[-3000:]
    return out / "final"


def tools_env(out: Path, task: dict[str, Path], taught: Path, **more: object) -> dict[str, str]:
    """GRPO from the taught model: 16 completions per step (4 prompts x 4), at most 32 tokens an episode."""
    settings = {"method": "grpo", "model": taught, "data": task["prompts.jsonl"],
                "reward": f"{task['rewards.py']}:looked_up", "rl_tools": f"{task['tools.py']}:lookup", "batch_size": 16,
                "rl_generations": 4, "rl_max_new_tokens": 32, "lr": 5e-4, "max_steps": STEPS,
                "save_steps": STEPS // 2, **more}  # fmt: skip
    return train_env(out, **settings)


def metrics_of(out: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def rewards_of(out: Path) -> list[float]:
    return [line["reward"] for line in metrics_of(out)]


@pytest.fixture(scope="module")
def tool_run(task: dict[str, Path], taught: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tools") / "out"
    code, err = finish(start(tools_env(out, task, taught)), 900)
    assert code == 0, err[-3000:]
    return out


def test_grpo_learns_to_use_the_tool_over_the_same_run_without_it(tool_run: Path, task: dict[str, Path],
                                                                  taught: Path, tmp_path: Path) -> None:  # fmt: skip
    """The reward (a value looked up in the episode) rises from the taught model's first 4 steps (it calls the tool
    about half the time) to the last 4; the same run without TRAIN_RL_TOOLS gets none at any step (a call it writes
    is text nobody answers). Measured (first 4 -> last 4 steps, with tools): see the print."""
    without = tmp_path / "without"
    env = {k: v for k, v in tools_env(without, task, taught).items() if k != "TRAIN_RL_TOOLS"}
    code, err = finish(start(env), 900)
    assert code == 0, err[-3000:]
    rewards, baseline = rewards_of(tool_run), rewards_of(without)
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    print(f"reward per step with the tool: {[round(r, 3) for r in rewards]} (first 4 {first:.3f}, last 4 {last:.3f}); "
          f"without: {[round(r, 3) for r in baseline]}")  # fmt: skip
    assert len(rewards) == len(baseline) == STEPS
    assert last >= first + RISE and last >= 0.6, rewards
    assert max(baseline) == 0.0 and "tools:" not in err


def test_each_step_counts_turns_and_tool_calls_and_the_samples_show_each_turn(
    tool_run: Path, task: dict[str, Path]
) -> None:
    """metrics.jsonl: turns per episode, tool calls, errors, timeouts and episodes at the turn limit every step, in
    agreement with TRL's own call frequency; samples.jsonl and TensorBoard's table: each episode turn by turn."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from trainer.provenance import file_sha256

    for line in metrics_of(tool_run):
        calls, turns = line["tools/calls"], line["tools/turns_per_episode"]
        assert line["tools/call_frequency"] == pytest.approx(calls / 16) and 1.0 <= turns <= 2.0, line
        assert line["tools/errors"] <= calls and line["tools/timeouts"] == 0 and line["tools/turn_limit"] == 0, line
    rows = [json.loads(line) for line in (tool_run / "samples.jsonl").read_text().splitlines()]
    assert {tuple(r) for r in rows} == {("step", "prompt", "completion", "turns", "rewards", "reward")}
    episode = next(r for r in rows if r["turns"] == 2 and r["reward"] == 1.0)
    lines = episode["completion"].splitlines()
    assert re.fullmatch(r'assistant: -> lookup\(\{"key": "k\d"\}\)', lines[0]), episode
    assert re.fullmatch(r"tool lookup: k\d = \w+", lines[1]) and lines[2].startswith("assistant: "), episode
    (events,) = (tool_run / "runs").rglob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events), size_guidance={"tensors": 0})
    accumulator.Reload()
    table = accumulator.Tensors("train/completions/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| step | prompt | completion | turns | looked_up | reward |" in table, table[:500]
    provenance = json.loads((tool_run / "provenance.json").read_text())["online_rl"]
    assert provenance["tool_files"] == {str(task["tools.py"]): file_sha256(task["tools.py"])}


def test_sigterm_during_a_tool_call_checkpoints_and_the_restart_trains_as_before(
    tool_run: Path, task: dict[str, Path], taught: Path, tmp_path: Path
) -> None:
    """After step 3 the next tool call takes 3 s (the tool file's `slow` switch); SIGTERM to the run's process group
    while it runs: the call finishes, the step with it, its checkpoint is written, exit 143. The restart continues
    from that checkpoint and ends with the uninterrupted run's per-step rewards, samples and weights."""
    out = tmp_path / "out"
    env = tools_env(out, task, taught)
    slow, calling = task["tools.py"].with_name("slow"), task["tools.py"].with_name("calling")
    calling.unlink(missing_ok=True)
    proc = start(env)
    try:
        wait_for(lambda: 3 in logged_steps(out), 600, "step 3", proc=proc)
        slow.write_text("3")
        wait_for(calling.exists, 120, "a tool call after step 3", proc=proc)
        os.killpg(proc.pid, signal.SIGTERM)
        code, err = finish(proc)
    finally:
        slow.unlink(missing_ok=True)
    assert code == 143, err[-3000:]
    stopped = int(re.search(r"checkpoint-(\d+) written", err)[1])
    assert stopped == max(logged_steps(out)) > 3 and not slow.exists(), err[-3000:]  # the call ran to its end
    code, err = finish(start(env), 900)
    assert code == 0 and f"continuing from {out / f'checkpoint-{stopped}'}" in err, err[-3000:]
    assert rewards_of(out) == rewards_of(tool_run)
    assert (out / "samples.jsonl").read_text() == (tool_run / "samples.jsonl").read_text()
    assert_same_weights(out / "final", tool_run / "final")


def test_reproduce_gives_the_same_rewards_and_refuses_an_edited_tool_file(
    tool_run: Path, task: dict[str, Path], tmp_path: Path, run_trainer
) -> None:
    again = tmp_path / "again"
    result = run_trainer(["reproduce", str(tool_run), "--steps", "4", "--output", str(again)],
                         env={"PYTHONPATH": str(REPO)}, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "are identical" in result.stdout, result.stdout
    assert rewards_of(again)[:4] == rewards_of(tool_run)[:4]
    tools = task["tools.py"]
    refused = reproduce_with_edited(run_trainer, tool_run, tools, tmp_path / "refused")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert f"the tool file {tools} changed" in refused.stderr, refused.stderr[-3000:]


def test_an_edited_tool_or_environment_file_is_refused_on_resume(task: dict[str, Path], tmp_path: Path) -> None:
    from trainer import checkpoint_record
    from trainer.config.parse import parse_settings
    from trainer.config.resume import check_drift, run_record
    from trainer.errors import ConfigError

    tools = tmp_path / "tools.py"
    tools.write_text(task["tools.py"].read_text())
    settings = parse_settings({"TRAIN_METHOD": "grpo", "TRAIN_REWARD": "exact", "TRAIN_RL_TOOLS": f"{tools}:lookup"})
    checkpoint = tmp_path / "checkpoint-6"
    checkpoint.mkdir()
    checkpoint_record.write_record(checkpoint, run_record(settings, {}), 6)
    check_drift(checkpoint, settings)  # unchanged: goes on
    tools.write_text(tools.read_text() + "# changed\n")
    with pytest.raises(ConfigError) as caught:
        check_drift(checkpoint, settings)
    assert "TRAIN_RL_TOOLS was" in caught.value.message and "TRAIN_RESUME_CHANGED_DATA=1" in caught.value.message


def test_named_environments_chosen_by_the_records_train(task: dict[str, Path], taught: Path, tmp_path: Path) -> None:
    """TRAIN_RL_ENVIRONMENT=lookup=env.py:Lookup,echo=env.py:Echo with each record's `environment`: two steps train,
    the environment that owns a reward logs it (rewards/Lookup/mean), each environment's tools reach its episodes."""
    rows = [json.loads(line) for line in task["prompts.jsonl"].read_text().splitlines()]
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({**row, "environment": ("lookup", "echo")[i % 2]}) + "\n"
                            for i, row in enumerate(rows)))  # fmt: skip
    out = tmp_path / "out"
    environments = f"lookup={task['environment.py']}:Lookup,echo={task['environment.py']}:Echo"
    env = tools_env(out, task, taught, data=data, max_steps=2, save_steps=2, rl_environment=environments)
    code, err = finish(start({k: v for k, v in env.items() if k != "TRAIN_RL_TOOLS"}), 900)
    assert code == 0, err[-3000:]
    assert "tools: Lookup ('lookup'): lookup; Echo ('echo'): echo" in err, err[-3000:]
    lines = metrics_of(out)
    assert len(lines) == 2
    assert all("rewards/Lookup/mean" in line and "tools/turns_per_episode" in line for line in lines), lines


def test_a_template_that_cannot_render_tools_exits_2_before_the_model_loads(
    task: dict[str, Path], taught: Path, tmp_path: Path
) -> None:
    plain = tmp_path / "plain.jinja"
    plain.write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    code, err = finish(start(tools_env(tmp_path / "out", task, taught, chat_template=plain)), 300)
    assert code == 2 and "Traceback" not in err, err[-3000:]
    assert f"the chat template ({plain} (TRAIN_CHAT_TEMPLATE)) cannot render tool calls and tool results" in err
    assert "model loaded" not in err, err[-3000:]
