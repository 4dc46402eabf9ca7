"""`python -m trainer.launch`: decide, print the plan, then supervise `train` (trainer.launch.supervise) or exec
any other command."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict

import trainer.launch as package
from trainer.launch.decide import TRAINER_COMMANDS, LaunchPlan, decide, describe
from trainer.launch.placement import LaunchError
from trainer.launch.supervise import supervise
from trainer.secrets import mask_args


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
        plan = decide(command, args, os.environ)
    except LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(describe(plan), file=sys.stderr, flush=True)
    if dry_run:
        if json_out:
            added = {k: v for k, v in plan.env.items() if os.environ.get(k) != v}
            report = {**asdict(plan), "env": added, "command": mask_args(plan.command)}
            print(json.dumps(report, indent=2))
        return 0
    if plan.supervised:
        return push_failed_code(supervise(plan), plan)
    os.execve(plan.command[0], plan.command, plan.env)
    return 1  # not reached


def push_failed_code(code: int, plan: LaunchPlan) -> int:
    """A multi-process run whose rank 0 finished but could not push (trainer.hub.push.push_after_run) exits 3."""
    from pathlib import Path

    from trainer.config.parse import default_output_dir
    from trainer.errors import EXIT_PUSH_FAILED
    from trainer.hub.push import PUSH_FAILED_MARKER

    output = plan.env.get("TRAIN_OUTPUT_DIR") or default_output_dir()
    if code == 0 and plan.distributed and (Path(output) / PUSH_FAILED_MARKER).is_file():
        print(f"error: the run finished but its push to the Hub failed (see {PUSH_FAILED_MARKER}); final/ is kept; "
              f"exit {EXIT_PUSH_FAILED}", file=sys.stderr)  # fmt: skip
        return EXIT_PUSH_FAILED
    return code


if __name__ == "__main__":
    sys.exit(main())
