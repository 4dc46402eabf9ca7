"""`python -m trainer.launch`: decide, print the decision, then exec the trainer or run torchrun."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import trainer.launch as package
from trainer.errors import exit_code_for_signal
from trainer.launch.decide import TRAINER_COMMANDS, Decision, decide, describe
from trainer.launch.placement import LaunchError
from trainer.secrets import mask_args

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


# ---------------------------------------------------------------- run


def run_torchrun(decision: Decision) -> int:
    """Run torchrun as a child and map its outcome to the trainer's exit codes (torchrun itself exits 1 for any
    failed worker, also after a SIGTERM the workers answered with 143).

    A stop (SIGTERM, SIGUSR1) goes to the trainer processes directly, so their checkpoint gets all the time the
    scheduler gives; once they have exited, torchrun gets SIGTERM (its own wait before SIGKILL is a fixed 30 s
    before torch 2.12, and it would restart the workers). SIGINT, SIGHUP and SIGQUIT go to torchrun."""
    received: list[int] = []
    child: subprocess.Popen | None = None

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        if child is None or child.poll() is not None:
            return
        if signum in STOP_SIGNALS:
            workers = children_of(child.pid)
            for pid in workers:
                _kill(pid, signal.SIGTERM)
            if len(received) == 1:
                log(f"{signal.Signals(signum).name}: SIGTERM to {len(workers)} trainer process(es); they checkpoint")
                threading.Thread(target=stop_torchrun_after, args=(child, workers), daemon=True).start()
        else:
            child.send_signal(signum)

    for sig in (*STOP_SIGNALS, *FORWARDED_SIGNALS):  # before the child exists: a stop must never orphan torchrun
        signal.signal(sig, on_signal)
    child = subprocess.Popen(decision.command, env=decision.env)
    if received:
        on_signal(received.pop(0), None)
    code = child.wait()
    if code != 0 and received:
        return exit_code_for_signal(signal.SIGTERM if received[0] in STOP_SIGNALS else received[0])
    return 128 - code if code < 0 else code


def stop_torchrun_after(child: subprocess.Popen, workers: list[int], poll_s: float = 0.05) -> None:
    """Once the stopped workers have exited, SIGTERM torchrun before it restarts them."""
    while any(_alive(pid) for pid in workers) and child.poll() is None:
        time.sleep(poll_s)
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)


def children_of(parent: int) -> list[int]:
    """PIDs whose parent is `parent` (torchrun's workers), from /proc."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # the command name (field 2) is in parentheses and may hold spaces; the parent PID is the 2nd field after it
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            pids.append(int(entry))
    return pids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # an exited worker stays a zombie until torchrun reaps it


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def log(message: str) -> None:
    print(f"trainkit launch: {message}", file=sys.stderr, flush=True)


def parse_cli(argv: Sequence[str]) -> tuple[bool, bool, str, list[str]]:
    """[--dry-run [--json]] [COMMAND (default train)] [--dry-run [--json]] ARGS...

    The dry run may also follow the command (the entrypoint passes `train --dry-run`); a `--json` after the
    command belongs to the command (`doctor --json`) unless it follows `--dry-run`."""
    rest = list(argv)
    if rest and rest[0] in ("-h", "--help"):
        print(package.__doc__)
        sys.exit(0)
    dry_run = json_out = False

    def take_dry_run() -> None:
        nonlocal dry_run, json_out
        if rest and rest[0] == "--dry-run":
            del rest[0]
            dry_run = True
            if rest and rest[0] == "--json":
                del rest[0]
                json_out = True

    take_dry_run()
    command = rest.pop(0) if rest and rest[0] in TRAINER_COMMANDS else "train"
    take_dry_run()
    return dry_run, json_out, command, rest


def main(argv: Sequence[str] | None = None) -> int:
    dry_run, json_out, command, args = parse_cli(sys.argv[1:] if argv is None else argv)
    try:
        decision = decide(command, args, os.environ)
    except LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(describe(decision), file=sys.stderr, flush=True)
    if dry_run:
        if json_out:
            added = {k: v for k, v in decision.env.items() if os.environ.get(k) != v}
            report = {**asdict(decision), "env": added, "command": mask_args(decision.command)}
            print(json.dumps(report, indent=2))
        return 0
    if not decision.distributed:
        os.execve(decision.command[0], decision.command, decision.env)
    return run_torchrun(decision)


if __name__ == "__main__":
    sys.exit(main())
