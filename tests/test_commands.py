"""trainer/commands.py is the one command list: `python -m trainer`'s subcommands, the launcher, scripts/run.py and the
image's entrypoint all take theirs from it (no Docker: the entrypoint runs on the host with a stand-in `python` that
prints what it was asked to run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.commands import COMMANDS, DEFAULT, names

ROOT = Path(__file__).resolve().parents[1]
ENTRYPOINT = ROOT / "entrypoints" / "entrypoint.sh"


def test_python_m_trainer_has_the_listed_commands_with_their_help() -> None:
    from trainer.__main__ import build_parser

    subparsers = build_parser()._subparsers._group_actions[0]  # argparse keeps the subcommands' action there
    assert list(subparsers.choices) == list(names())
    shown = {action.dest: action.help for action in subparsers._choices_actions}
    assert shown == {command.name: command.help for command in COMMANDS}


def test_every_command_lives_in_one_kind_of_home() -> None:
    """A command's module is its package's `command.py` (trainer/PACKAGE/command.py) or `trainer/NAME_command.py`,
    and every module so named is a listed command's: no command hides in a library module."""
    homes = {command.name: command.module for command in COMMANDS}
    misplaced = {}
    for name, module in homes.items():
        parts = module.split(".")
        package = ROOT / "trainer" / parts[1] / "__init__.py"
        in_package = len(parts) == 3 and parts[2] == "command" and package.is_file()
        alone = parts == ["trainer", f"{name}_command"]
        if not (in_package or alone) or not (ROOT / Path(*parts)).with_suffix(".py").is_file():
            misplaced[name] = module
    assert misplaced == {}
    named = {".".join(p.relative_to(ROOT).with_suffix("").parts) for p in (ROOT / "trainer").rglob("*command.py")}
    assert named - {"trainer.commands"} == set(homes.values())


def test_the_launcher_takes_every_command_and_distributes_train_only() -> None:
    from trainer.launch.cli import parse_cli
    from trainer.launch.decide import DISTRIBUTED_COMMANDS

    for name in names():
        assert parse_cli([name, "--json"])[2:] == (name, ["--json"])
    assert parse_cli(["--bogus"])[2:] == (DEFAULT, ["--bogus"])  # any other first word is train's argument
    assert {"train"} == DISTRIBUTED_COMMANDS


def test_the_launcher_runs_diff_as_one_trainer_process() -> None:
    """`diff` was train's argument to the launcher before the list (it knew train, config, doctor and bench)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "trainer.launch", "--dry-run", "--json", "diff", "a", "b"], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    plan = json.loads(done.stdout)
    assert plan["command"][1:] == ["-m", "trainer", "diff", "a", "b"] and not plan["distributed"]


@pytest.fixture(scope="module")
def run_py():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import run

        yield run
    finally:
        sys.path.remove(str(ROOT / "scripts"))


def test_run_py_forwards_every_container_command(run_py) -> None:
    from errors import UserError

    assert names(on_host=False) == run_py.FORWARDED
    for name in run_py.FORWARDED:
        assert run_py.parse_args([name, "--json"]).command == [name, "--json"]
    assert run_py.parse_args(["--gpus", "none", "diff", "/output/a", "/output/b"]).command == ["diff", "/output/a",
                                                                                            "/output/b"]  # fmt: skip
    assert run_py.parse_args([]).command == [DEFAULT]
    for name in names(on_host=True):  # run.py's own: `run.py reproduce OUTPUT_DIR [options]`
        with pytest.raises(UserError, match=f"{name} comes first"):
            run_py.parse_args(["--gpus", "none", name])
    with pytest.raises(UserError, match="unknown command 'fly'"):
        run_py.parse_args(["fly"])


def test_run_py_passes_exports_quant_options_through_whole(run_py) -> None:
    """`run.py export` hands --quant and the quality gate's options to the trainer as given (none is run.py's: an
    abbreviation of one of its own options would be taken by it instead)."""
    from trainer.__main__ import build_parser

    argv = ["export", "/output", "/output/gguf", "--quant", "q8_0", "--quant", "q4_k_m", "--max-ppl-increase", "2",
            "--allow-quality-loss", "--eval-data", "/data/eval.txt", "--eval-context", "64"]  # fmt: skip
    assert run_py.parse_args(["--gpus", "none", *argv]).command == argv
    parsed = build_parser().parse_args(argv)
    assert (parsed.quant, parsed.max_ppl_increase, parsed.allow_quality_loss, parsed.eval_data,
            parsed.eval_context) == (["q8_0", "q4_k_m"], 2.0, True, "/data/eval.txt", 64)  # fmt: skip


def dispatch(tmp_path: Path, *args: str) -> tuple[list[str], str]:
    """(what the entrypoint execs, its log) for `entrypoint.sh ARGS`, with a `python` that prints its argv."""
    bin_dir = tmp_path / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        for program in ("python", "bash-standin"):
            (bin_dir / program).write_text('#!/bin/sh\nprintf "%s\\n" "$(basename "$0")" "$@"\n')
            (bin_dir / program).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(["bash", str(ENTRYPOINT), *args], env=env, capture_output=True, text=True, timeout=30,
                          check=True)  # fmt: skip
    return done.stdout.splitlines(), done.stderr


def test_the_entrypoint_dispatches_every_listed_command(tmp_path) -> None:
    for command in COMMANDS:
        runs, log = dispatch(tmp_path, command.name, "--x", "secret-value")
        module = "trainer.launch" if command.distributed else "trainer"
        assert runs == ["python", "-m", module, command.name, "--x", "secret-value"], command.name
        assert f"running python -m {module} {command.name}\n" in log and "secret-value" not in log
    assert dispatch(tmp_path)[0] == ["python", "-m", "trainer.launch", DEFAULT]
    assert dispatch(tmp_path, "--bogus")[0] == ["python", "-m", "trainer.launch", DEFAULT, "--bogus"]
    assert dispatch(tmp_path, "bash-standin", "x")[0] == ["bash-standin", "x"]  # any other command, as given
