"""Multi-turn GRPO on vLLM for real, on the CPU (the CPU RL venv, bash tests/rl/run.sh): a `python -m trainer` run in
colocate mode with TRAIN_RL_TOOLS and TRAIN_RL_ENVIRONMENT, its policy scripted (test_rl_tool_calls.py's script,
forced through a logits processor vLLM's engine runs), whose trained tokens are the ones vLLM generated, turn by
turn, the tool results between them out of the loss. Skipped where no vLLM is installed (the main venv)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO
from test_rl_tool_calls import (  # noqa: F401 (the fixtures `task` and `policy_folder`: once per module)
    check_rollouts,
    policy_folder_fixture,
    task_fixture,
)
from train_runs import finish, start, train_env

from trainer.vllm_compat import installed_vllm

pytestmark = pytest.mark.skipif(installed_vllm() is None, reason="needs vLLM: the CPU RL venv (bash tests/rl/run.sh)")


def test_a_vllm_run_with_tools_trains_on_the_tokens_it_generated(task: dict[str, Path], policy_folder: Path,
                                                                 tmp_path: Path) -> None:  # fmt: skip
    """Two steps of 2 prompts x 2 completions, three turns each (a call split across tokens, a call with a wrong
    argument type, the answer byte by byte): each step's completions are what vLLM returned per turn with the
    template's tool results between, those out of the loss; the tool calls and turns counted per step, the
    environment's tools offered beside the file's."""
    record, out = tmp_path / "record.jsonl", tmp_path / "out"
    env = train_env(out, method="grpo", model=policy_folder, data=task["prompts.jsonl"],
                    reward=f"{task['rewards.py']}:looked_up", rl_tools=f"{task['tools.py']}:lookup",
                    rl_environment=f"{task['environment.py']}:Echo", rl_engine="vllm", batch_size=4, rl_generations=2,
                    rl_max_new_tokens=160, max_steps=2, save_steps=2)  # fmt: skip
    code, err = finish(start(env, (str(REPO / "tests" / "trainer" / "tool_policy.py"), str(record))), 900)
    assert code == 0, err[-4000:]
    assert "generation: vLLM in this process (TRL's colocate mode" in err and "tools: lookup; Echo: echo" in err
    steps = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(steps) == 2
    for seen in steps:
        check_rollouts(seen, policy_folder)
        assert len(seen["generated"]) == 3  # one generation per turn
    for line in (json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()):
        assert (line["tools/calls"], line["tools/errors"], line["tools/turns_per_episode"]) == (8, 4, 3), line
        assert line["rewards/looked_up/mean"] == 1.0, line
