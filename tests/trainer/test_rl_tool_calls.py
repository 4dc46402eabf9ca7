"""Multi-turn GRPO's plumbing, in this process: a scripted policy through trainkit's layer on TRL's tool loop
(Transformers' generate), whose trained tokens are the generated ones, token by token, with the tool results between
them out of the loss, turn by turn; and each tool call made safely (trainer.run.tool_calls): arguments checked against
the type hints, exceptions and time limits as messages, one grace after a stop signal, no shell. The vLLM engine's
scripted run: test_vllm_tools.py (the CPU RL venv)."""

from __future__ import annotations

import ast
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any, Literal

import pytest
from conftest import REPO
from tool_policy import SCRIPT, rollouts
from tool_task import write_task

from trainer.run.tool_calls import CallCounts, ToolError, argument_problem, guarded
from trainer.run.user_code import STOP_GRACE_S


@pytest.fixture(scope="module", name="task")  # also test_vllm_tools.py's (imported there)
def task_fixture(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_task(tmp_path_factory.mktemp("tool_task"))


@pytest.fixture(scope="module", name="policy_folder")  # also test_vllm_tools.py's
def policy_folder_fixture(task: dict[str, Path]) -> Path:
    """A random tiny model with the task's tokenizer and the built-in chatml (the policy is scripted)."""
    import torch
    from transformers import AutoTokenizer

    from trainer.data.chat import BUILTIN_TEMPLATES
    from trainer.model.loading import LoadHow, Weights, load

    folder = task["tokenizer"].parent / "policy"
    tokenizer = AutoTokenizer.from_pretrained(task["tokenizer"])
    tokenizer.chat_template = BUILTIN_TEMPLATES["chatml"].read_text()
    torch.manual_seed(0)
    load(Weights(preset="tiny", tokenizer=tokenizer), LoadHow()).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def check_rollouts(seen: dict[str, Any], folder: Path) -> None:
    """Each completion is the script's turns as generated, with the template's rendering of the tool results between
    them: those tokens out of the loss, every generated one in it; none of the turns is the tokenizer's own encoding
    of its text (a decode and encode would have changed them)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    script = seen["script"]
    for turn in script:
        assert tokenizer(tokenizer.decode(turn), add_special_tokens=False)["input_ids"] != turn
    calls = seen["generated"]
    script = script[: len(calls)]  # a turn limit ends the episodes early
    for row, (ids, mask) in enumerate(zip(seen["completion_ids"], seen["loss_mask"], strict=True)):
        generated = [call[row] for call in calls]
        assert generated == script  # the engine returned the script, stopping where each turn ends
        runs = _runs(ids, mask)  # (trained?, ids) stretches, in order
        assert [part for trained, part in runs if trained] == generated, runs
        between = [tokenizer.decode(part) for trained, part in runs if not trained]
        assert between[0].startswith("\n<|im_start|>tool\n<tool_response>\nk3 = ")  # the tool's result
        assert len(between) < 2 or "lookup was not called: the argument 'key' must be str, not 3 (int)" in between[1]
        assert all(b.endswith("<|im_start|>assistant\n") for b in between)
        # the tool tokens are what the template renders after the end of the turn, as ids
        expected = tokenizer(between[0], add_special_tokens=False)["input_ids"]
        assert runs[1][1] == expected


def _runs(ids: list[int], mask: list[int]) -> list[tuple[bool, list[int]]]:
    """The completion's stretches of trained and untrained tokens (right padding, untrained, left out)."""
    last = max(i for i, m in enumerate(mask) if m) + 1
    runs: list[tuple[bool, list[int]]] = []
    for token, m in zip(ids[:last], mask[:last], strict=True):
        if runs and runs[-1][0] == bool(m):
            runs[-1][1].append(token)
        else:
            runs.append((bool(m), [token]))
    return runs


def test_the_trained_tokens_are_the_generated_ones_turn_by_turn(policy_folder: Path, task: dict[str, Path]) -> None:
    """Transformers' generate forced to the script, through TRL's tool loop and trainkit's layer: three turns (a
    call split across tokens, a call whose argument has the wrong type, an answer with a multi-byte character byte by
    byte and a space apart from its word), two rounds of tool results; metrics per step count them."""
    seen = rollouts(str(policy_folder), str(task["tools.py"]))
    check_rollouts(seen, policy_folder)
    assert len(seen["generated"]) == len(SCRIPT)  # one generation per turn, every row in it
    assert seen["metrics"] == {**seen["metrics"], "tools/calls": 8.0, "tools/errors": 4.0, "tools/timeouts": 0.0,
                               "tools/turns_per_episode": 3.0, "tools/turn_limit": 0.0}  # fmt: skip
    limited = rollouts(str(policy_folder), str(task["tools.py"]), max_turns=2)  # the second turn's call: unanswered
    check_rollouts(limited, policy_folder)
    assert len(limited["generated"]) == 2
    assert limited["metrics"] == {**limited["metrics"], "tools/calls": 4.0, "tools/turns_per_episode": 2.0,
                                  "tools/turn_limit": 4.0}  # fmt: skip


# ---- each call made safely --------------------------------------------------------------------------------------


def takes(key: str, count: int, scale: float, flags: list[bool], mode: Literal["a", "b"], note: str | None = None,
          table: dict[str, int] | None = None) -> str:  # fmt: skip
    """A tool with every kind of hint the model's JSON arguments are checked against.

    Args:
        key: text
        count: a whole number
        scale: a number
        flags: booleans
        mode: a or b
        note: optional text
        table: optional numbers by name
    """
    return f"{key}:{count}:{scale}:{flags}:{mode}:{note}:{table}:{os.getpid()}"


GOOD = {"key": "k", "count": 2, "scale": 1, "flags": [True], "mode": "a"}


@pytest.mark.parametrize(("arguments", "problem"), [
    (GOOD, None),
    ({**GOOD, "note": None, "table": {"x": 1}, "scale": 0.5}, None),
    ({**GOOD, "extra": 1}, "it takes no argument 'extra' (its arguments: key, count, scale, flags, mode, note, table)"),
    ({k: v for k, v in GOOD.items() if k != "count"}, "the argument 'count' is missing"),
    ({**GOOD, "count": "2"}, "the argument 'count' must be int, not '2' (str)"),
    ({**GOOD, "count": True}, "the argument 'count' must be int, not True (bool)"),
    ({**GOOD, "scale": "x"}, "the argument 'scale' must be float, not 'x' (str)"),
    ({**GOOD, "flags": [1]}, "the argument 'flags' must be list[bool], not [1] (list)"),
    ({**GOOD, "mode": "c"}, "the argument 'mode' must be one of 'a', 'b', not 'c' (str)"),
    ({**GOOD, "table": {"x": "1"}}, "the argument 'table' must be dict[str, int] | None, not {'x': '1'} (dict)"),
    (["k"], "its arguments must be a JSON object, not list"),
], ids=["good", "optional", "unknown", "missing", "str-for-int", "bool-for-int", "str-for-float", "list-item",
        "literal", "dict-value", "not-an-object"])  # fmt: skip
def test_the_models_arguments_are_checked_against_the_hints(arguments: Any, problem: str | None) -> None:
    assert argument_problem(takes, arguments) == problem
    counts = CallCounts()
    call = guarded("takes", takes, 5.0, counts)
    if problem is None:
        assert call(**arguments).endswith(f":{os.getpid()}")  # called in this process: no shell, no subprocess
    elif isinstance(arguments, dict):  # (TRL itself refuses arguments that are no object: it calls tool(**arguments))
        with pytest.raises(ToolError, match=rf"^takes was not called: {re.escape(problem)}$"):
            call(**arguments)


def test_a_raise_or_a_time_limit_is_a_message_and_a_count() -> None:
    """An exception becomes the message the model reads (TRL counts the failed call); a call past the time limit is
    ended and counted as a timeout, in about the limit; an async tool is bounded alike."""
    import asyncio

    counts = CallCounts()

    def broken(key: str) -> str:
        """Fails.

        Args:
            key: a key
        """
        raise KeyError(key)

    def hangs(key: str) -> str:
        """Never returns.

        Args:
            key: a key
        """
        try:
            time.sleep(3600)
        except Exception:  # the user's code cannot swallow the end of the call
            return "swallowed"
        return "slept"

    async def hangs_async(key: str) -> str:
        """Never returns either.

        Args:
            key: a key
        """
        await asyncio.sleep(3600)
        return "slept"

    with pytest.raises(ToolError, match=r"^broken raised KeyError: 'k9'$"):
        guarded("broken", broken, 5.0, counts)(key="k9")
    began = time.monotonic()
    with pytest.raises(ToolError, match=r"^hangs did not return within 0.3 s and was ended$"):
        guarded("hangs", hangs, 0.3, counts)(key="k")
    assert time.monotonic() - began < 5 and counts.timeouts == 1
    with pytest.raises(ToolError, match=r"^hangs_async did not return within 0.3 s and was ended$"):
        asyncio.run(guarded("hangs_async", hangs_async, 0.3, counts)(key="k"))
    assert (counts.timeouts, counts.stopped) == (2, 0)


def test_a_stop_signal_ends_a_hung_tool_after_the_grace_and_skips_the_calls_after_it() -> None:
    """SIGTERM (to this process, from outside, as a scheduler sends it) while a tool without a time limit hangs: the
    run's handler records the stop, the call goes on for the grace, then ends (counted), so the step can finish and
    be checkpointed; the next call is not made at all. Before, a hung tool held the step, and the stop, forever."""
    from trainer.run import signals

    def hangs(key: str) -> str:
        """Never returns.

        Args:
            key: a key
        """
        time.sleep(3600)
        return "slept"

    stop = signals.GracefulStop().install()
    counts = CallCounts()
    try:
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
        began = time.monotonic()
        with pytest.raises(ToolError, match=r"^hangs was ended: the run is stopping$"):
            guarded("hangs", hangs, 0.0, counts)(key="k")
        waited = time.monotonic() - began
        with pytest.raises(ToolError, match=r"^hangs was not called: the run is stopping$"):
            guarded("hangs", hangs, 0.0, counts)(key="k")
    finally:
        stop.restore()
        signals._REQUESTED.clear()
        signals._REQUESTED_AT.clear()
    assert stop.signum == signal.SIGTERM
    assert STOP_GRACE_S < waited < STOP_GRACE_S + 5, waited
    assert (counts.timeouts, counts.stopped) == (2, 2)


def test_no_shell_or_subprocess_where_trainkit_calls_the_users_code() -> None:
    """The modules that import and call tools, environments and rewards start no process and no shell."""
    forbidden = {"subprocess", "pty", "multiprocessing", "shlex"}
    for name in ("tool_calls", "tools", "multi_turn", "user_code", "rewards"):
        tree = ast.parse((REPO / "trainer" / "run" / f"{name}.py").read_text())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}  # fmt: skip
        imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and node.module}  # fmt: skip
        calls = {f"{node.func.value.id}.{node.func.attr}" for node in ast.walk(tree) if isinstance(node, ast.Call)
                 and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)}  # fmt: skip
        assert not imported & forbidden and not calls & {"os.system", "os.popen", "os.exec", "os.spawnv"}, name


# ---- checked before the model loads -------------------------------------------------------------------------------

BAD_TOOLS = '''
import json


def no_docstring(key: str) -> str:
    return key


def no_hint(key) -> str:
    """No hint.

    Args:
        key: a key
    """
    return key


def args_unnamed(key: str) -> str:
    """The docstring does not describe key."""
    return key


class NoReset:
    def act(self, x: int) -> int:
        """Act.

        Args:
            x: a number
        """
        return x
'''


def static(tmp_path: Path, rows: list[dict[str, Any]], **env: str) -> str:
    """`config`'s checks (no torch) of a GRPO run on these prompts with these settings."""
    import json

    from trainer.config.checks import static_problems
    from trainer.config.inputs import Inputs
    from trainer.config.parse import parse_settings

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    settings = parse_settings({"TRAIN_DATA": str(data), "TRAIN_OUTPUT_DIR": str(tmp_path / "out"),
                               "TRAIN_METHOD": "grpo", "TRAIN_REWARD": "contains", "TRAIN_CHAT_TEMPLATE": "chatml",
                               **env})  # fmt: skip
    return "\n".join(static_problems(Inputs(settings)))


def test_tool_settings_and_files_are_checked_before_torch(tmp_path: Path, task: dict[str, Path]) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(BAD_TOOLS)
    tools, env = str(task["tools.py"]), str(task["environment.py"])
    chat = [{"prompt": [{"role": "user", "content": "k1"}], "answer": "k1", "environment": "lookup"}] * 4
    assert static(tmp_path, chat, TRAIN_RL_TOOLS=f"{tools}:lookup") == ""
    assert static(tmp_path, chat, TRAIN_RL_ENVIRONMENT=f"lookup={env}:Lookup,echo={env}:Echo") == ""
    found = static(tmp_path, chat, TRAIN_RL_TOOLS=f"{bad}:no_docstring,no_hint,missing,{tmp_path}/none.py:f",
                   TRAIN_RL_ENVIRONMENT=f"{bad}:NoReset")  # fmt: skip
    for expected in (f"TRAIN_RL_TOOLS: the tool no_docstring in {bad} has no docstring",
                     f"TRAIN_RL_TOOLS: the tool no_hint in {bad}: the argument 'key' has no type hint",
                     f"TRAIN_RL_TOOLS: {bad} defines no function 'missing' at its top level (its functions: "
                     "args_unnamed, no_docstring, no_hint)",
                     f"TRAIN_RL_TOOLS: no such Python file {tmp_path}/none.py",
                     f"TRAIN_RL_ENVIRONMENT: NoReset in {bad} has no `reset` method"):  # fmt: skip
        assert expected in found, found
    unknown = static(tmp_path, [*chat[:3], {**chat[0], "environment": "chess"}],
                     TRAIN_RL_ENVIRONMENT=f"lookup={env}:Lookup,echo={env}:Echo")  # fmt: skip
    where = tmp_path / "prompts.jsonl"
    assert f"the record at {where}:4 names the environment 'chess', which is none of lookup, echo (1 of 4 records " \
           "do not name one of them)" in unknown, unknown  # fmt: skip
    text = static(tmp_path, [{"prompt": "k1", "answer": "k1"}] * 4, TRAIN_RL_TOOLS=f"{tools}:lookup")
    assert "the prompts must be conversations" in text and "TRAIN_DATA holds text prompts" in text, text
    assert "TRAIN_RL_TOOLS applies to TRAIN_METHOD=grpo, not TRAIN_METHOD=rloo" in static(
        tmp_path, chat, TRAIN_METHOD="rloo", TRAIN_RL_TOOLS=f"{tools}:lookup")  # fmt: skip
    assert "TRAIN_RL_MAX_TURNS: for multi-turn runs (TRAIN_RL_TOOLS or TRAIN_RL_ENVIRONMENT)" in static(
        tmp_path, chat, TRAIN_RL_MAX_TURNS="3")  # fmt: skip
    several = static(tmp_path, chat, TRAIN_RL_ENVIRONMENT=f"{env}:Lookup,{env}:Echo")
    assert "several environments need a name each (name=path/env.py:Class,...)" in several, several


def test_tools_are_imported_and_checked_as_trl_uses_them_before_the_model_loads(tmp_path: Path) -> None:
    """What ast cannot see: the file's import, the docstring's Args against the signature (Transformers'
    get_json_schema, which TRL renders the prompt with), `reset` where the class inherits; a chat template that
    cannot render a tool exchange, named."""
    from trainer.errors import ConfigError
    from trainer.run.tools import check_template, load_toolbox
    from trainer.tokenizer import byte_level_tokenizer

    bad = tmp_path / "bad.py"
    bad.write_text(BAD_TOOLS)
    broken = tmp_path / "broken.py"
    broken.write_text("import not_installed_anywhere\n")
    for tools, environment, expected in (
        (f"{broken}:f", "", f"TRAIN_RL_TOOLS: importing {broken} failed: ModuleNotFoundError: No module named "
                            "'not_installed_anywhere'"),
        (f"{bad}:args_unnamed", "", f"TRAIN_RL_TOOLS: the tool args_unnamed in {bad}: Cannot generate JSON schema "
                                    "for args_unnamed because the docstring has no description for the argument 'key'"),
        ("", f"{bad}:NoReset", f"TRAIN_RL_ENVIRONMENT: NoReset in {bad} has no `reset` method"),
    ):  # fmt: skip
        with pytest.raises(ConfigError) as caught:
            load_toolbox(tools, environment)
        assert expected in caught.value.message, caught.value.message
    tokenizer = byte_level_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    with pytest.raises(ConfigError) as caught:
        check_template(tokenizer, "plain.jinja (TRAIN_CHAT_TEMPLATE)")
    assert caught.value.message.startswith("the chat template (plain.jinja (TRAIN_CHAT_TEMPLATE)) cannot render "
                                           "tool calls and tool results"), caught.value.message  # fmt: skip


def test_an_environment_that_fails_ends_the_run_named(task: dict[str, Path]) -> None:
    """reset raising, get_reward raising or giving no number: exit 2 naming the class (and the record), as a failing
    reward function; reset gets the record's columns it takes, without trainkit's record location."""
    from trainer.data.prompts import WHERE
    from trainer.run.rewards import RewardFailed
    from trainer.run.tools import environment_factory, load_toolbox

    toolbox = load_toolbox("", f"lookup={task['environment.py']}:Lookup,broken={task['environment.py']}:Broken")
    lookup = environment_factory(toolbox.environments["lookup"])()
    lookup.reset(key="k1", answer="x", **{WHERE: "prompts.jsonl:3"})
    assert lookup.key == "k1" and lookup.get_reward() == 0.0
    lookup.asked = None
    with pytest.raises(RewardFailed, match=r"Lookup.get_reward raised TypeError"):
        lookup.get_reward()
    broken = environment_factory(toolbox.environments["broken"])()
    with pytest.raises(RewardFailed, match=r"Broken.reset raised RuntimeError: no episode today \(on the record at "
                                           r"prompts.jsonl:3\)"):  # fmt: skip
        broken.reset(key="k1", **{WHERE: "prompts.jsonl:3"})
