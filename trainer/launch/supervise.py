"""Run `train` as a child of the launcher and deliver a stop so that the checkpoint gets the scheduler's whole grace.

Who hears a stop signal: Slurm signals every process of a step (`scancel --signal`, the time limit's signal);
dumb-init, PID 1 of the image under `docker stop` and Kubernetes, signals the launcher's process group. torchrun,
when it hears SIGTERM itself, SIGKILLs its workers a fixed 30 s later before torch 2.12 (TORCH_ELASTIC_SHUTDOWN_TIMEOUT
exists from 2.12 on; NGC's default row ships 2.7), and it restarts workers that stopped. So:

- the child (torchrun, or the trainer itself) starts in its own session, so a process-group signal reaches the
  launcher only, and with SIGUSR1 ignored, which survives exec: torchrun, its workers and their data loaders ignore a
  step-wide SIGUSR1 (`scancel --signal=USR1`), and only the launcher acts on it;
- on the first SIGTERM or SIGUSR1 the launcher sends SIGTERM to the trainer processes (torchrun's workers, or the
  trainer), waits until they have exited (they checkpoint first), and only then stops torchrun. Told so by a file
  in the outcome folder, workers that stopped cleanly exit 0: torchrun restarts the group as soon as one worker ends
  non-zero, which it would see while the others are still exiting, before the launcher's SIGTERM (which its log
  tailer may even swallow). Stopped, torchrun skips its exit barrier: a node stopped alone does not wait there for
  the others (300 s). Where every worker finished the run instead (the stop came after the last step), torchrun is
  left to end by itself, through that barrier, which the other nodes' torchruns wait on;
- SIGINT, SIGHUP and SIGQUIT are forwarded to the child;
- the child dies with the launcher (trainer.lifetime: a SIGKILL to the launcher must not leave a trainer holding
  the GPUs; torchrun's workers die with torchrun), and a child killed by a signal kills the launcher with the same
  signal, so callers see what happened (e.g. the OOM killer's SIGKILL).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from trainer.errors import EXIT_DIVERGED, OUTCOME_DIR_ENV, STOP_REQUESTED, STOPPED_CODES, exit_code_for_signal
from trainer.launch.decide import LaunchPlan
from trainer.lifetime import die_with_parent

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def supervise(plan: LaunchPlan) -> int:
    """Run the decided command; return the trainer's exit code. After a stop, the trainers' real outcome: torchrun
    exits 0 when its workers stopped cleanly (they exit 0 for it) and 1 for any failed worker, so each trainer writes
    its exit code into a folder named by OUTCOME_DIR_ENV, and a crash or a kill during the stop checkpoint is
    reported as such, never as "checkpoint written"."""
    stops: list[int] = []
    pending: list[int] = []
    trainers: list[int] = []  # the trainer processes the stop went to
    child: subprocess.Popen | None = None
    outcomes = Path(tempfile.mkdtemp(prefix="trainkit-outcomes-"))
    env = {**plan.env, OUTCOME_DIR_ENV: str(outcomes)}

    def on_signal(signum: int, _frame: object) -> None:
        if child is None:
            pending.append(signum)
        elif signum not in STOP_SIGNALS:
            _kill(child.pid, signum)
        elif stops:
            log(f"{signal.Signals(signum).name} again: the trainer is already stopping")
        else:
            stops.append(signum)
            threading.Thread(target=stop_trainers, args=(child, plan.distributed, signum, trainers, outcomes),
                             daemon=True).start()  # fmt: skip

    for sig in (*STOP_SIGNALS, *FORWARDED_SIGNALS):  # before the child exists: a stop must never orphan it
        signal.signal(sig, on_signal)
    child = subprocess.Popen(plan.command, env=env, start_new_session=True, preexec_fn=_prepare_child)
    for signum in pending:
        on_signal(signum, None)
    code = child.wait()
    if stops and plan.distributed:
        code = outcome_after_stop(trainers, outcomes)
    elif plan.distributed and code != 0:
        code = diverged_or(code, outcomes)
    shutil.rmtree(outcomes, ignore_errors=True)
    if code < 0:  # die the way the child died
        with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP have no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def outcome_after_stop(trainers: list[int], outcomes: Path) -> int:
    """The workers' real outcome after a stop: 128+N when every one stopped cleanly after its checkpoint, else the
    first failure (a worker that wrote no outcome was killed, e.g. by the OOM killer: 137)."""
    killed = exit_code_for_signal(signal.SIGKILL)
    codes = recorded_codes(trainers, outcomes)
    for pid in [pid for pid, code in codes.items() if code is None]:
        codes[pid] = killed
        log(f"trainer process {pid} ended without an exit code (killed, e.g. by the OOM killer's SIGKILL)")
    failed = sorted((c for c in codes.values() if c not in (0, *STOPPED_CODES)), key=lambda c: c != killed)
    if failed:  # a kill first: the other ranks' crashes usually follow from their peer's death
        log(f"the stop did not end cleanly: trainer exit codes {sorted(codes.values())}; exit {failed[0]}")
        return failed[0]
    return max(codes.values(), default=exit_code_for_signal(signal.SIGTERM))


def diverged_or(code: int, outcomes: Path) -> int:
    """EXIT_DIVERGED when a worker (of any of torchrun's attempts) ended the run for a non-finite loss (torchrun
    itself exits 1 for it), else `code`."""
    for path in outcomes.iterdir():
        with contextlib.suppress(OSError, ValueError):
            if int(path.read_text()) == EXIT_DIVERGED:
                log(f"a trainer process found the run diverged (exit {EXIT_DIVERGED}); torchrun exited {code}")
                return EXIT_DIVERGED
    return code


def recorded_codes(trainers: list[int], outcomes: Path) -> dict[int, int | None]:
    """Each trainer's exit code as it wrote it on the way out (None: it wrote none)."""
    codes: dict[int, int | None] = {}
    for pid in trainers:
        try:
            codes[pid] = int((outcomes / str(pid)).read_text())
        except (OSError, ValueError):
            codes[pid] = None
    return codes


def stop_trainers(child: subprocess.Popen, distributed: bool, signum: int, trainers: list[int], outcomes: Path,
                  poll_s: float = 0.05) -> None:  # fmt: skip
    """SIGTERM to the trainer processes (recorded in `trainers`); with torchrun, SIGTERM to torchrun once they have
    exited, unless every one of them finished (exit 0 in `outcomes`)."""
    if distributed:
        (outcomes / STOP_REQUESTED).touch()  # the workers exit 0 after a clean stop (trainer.errors.record_outcome)
    trainers += children_of(child.pid) if distributed else [child.pid]
    log(f"{signal.Signals(signum).name}: SIGTERM to {len(trainers)} trainer process(es); they checkpoint and stop")
    for pid in trainers:
        _kill(pid, signal.SIGTERM)
    if not distributed:
        return
    while any(_alive(pid) for pid in trainers) and child.poll() is None:
        time.sleep(poll_s)
    if set(recorded_codes(trainers, outcomes).values()) == {0}:
        log("every trainer process finished the run before the stop reached it; torchrun ends by itself")
    elif child.poll() is None:  # before it restarts a worker that failed; a clean stop skips the exit barrier
        _kill(child.pid, signal.SIGTERM)


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


def _prepare_child() -> None:
    """In the child, before exec: ignore SIGUSR1 (inherited through exec) and die with the launcher."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    die_with_parent()


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def log(message: str) -> None:
    print(f"trainkit launch: {message}", file=sys.stderr, flush=True)
