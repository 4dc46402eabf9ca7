"""`python -m trainer.launch`: decide, print the decision, then exec the trainer or run torchrun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict

import trainer.launch as package
from trainer.launch.decide import TRAINER_COMMANDS, Decision, decide, describe
from trainer.launch.placement import LaunchError
from trainer.secrets import mask_args

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


# ---------------------------------------------------------------- run


def run_torchrun(decision: Decision) -> int:
    """Run torchrun as a child, forward stop signals to it, and map the outcome to the trainer's exit codes
    (torchrun itself exits 1 for any failed worker, also after a SIGTERM the workers answered with 143)."""
    received: list[int] = []
    child: subprocess.Popen | None = None

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    for sig in FORWARDED_SIGNALS:  # before the child exists: a stop signal must never orphan torchrun
        signal.signal(sig, forward)
    child = subprocess.Popen(decision.command, env=decision.env)
    if received and child.poll() is None:
        child.send_signal(received[0])
    code = child.wait()
    if code != 0 and received:
        return 128 + received[0]
    return 128 - code if code < 0 else code


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
