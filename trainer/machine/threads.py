"""How many threads a training process computes with, and how its idle OpenMP threads wait: the one rule, decided
before torch is imported (OpenMP reads both variables when it starts) and logged with its reason.

- Threads: OMP_NUM_THREADS where the user set it; else the cores this process really has (trainer/machine/cores.py:
  its affinity, capped by a cgroup CPU quota such as `docker run --cpus 1`), shared among the node's processes. Left
  alone, torch starts one thread per core it sees, quota or not.
- Waiting: OMP_WAIT_POLICY where the user set it; else PASSIVE. Torch's OpenMP (GNU libgomp) spins a waiting thread
  before it sleeps; when another process holds one of the cores, every parallel region then waits for a thread that is
  not running while the other spins. Measured on the project's 2-core machine (docs/running.md, "CPU threads"): a tiny
  run's step took 14-15 s spinning against 4-5 s sleeping, and burnt 4.2 against 1.8 CPU seconds.

The launcher decides for the processes it starts (their count known) and passes the line on in DECIDED, which the
training process then logs instead of deciding again; a trainer started directly decides for itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from trainer.machine.cores import CGROUP_ROOT, usable_cores

DECIDED = "TRAINKIT_THREADS"  # the decision's log line, set with the variables it decided


def thread_env(environ: Mapping[str, str], processes: int = 1, root: Path = CGROUP_ROOT) -> tuple[dict[str, str], str]:
    """(the variables to add to `environ`, the decision's log line) for `processes` training processes on this node;
    a variable the user set is kept and named as theirs."""
    if environ.get(DECIDED):
        return {}, environ[DECIDED]
    added: dict[str, str] = {}
    given = environ.get("OMP_NUM_THREADS", "").strip()
    if given:
        threads = f"{given} per process (OMP_NUM_THREADS={given}, yours)"
    else:
        cores, found = usable_cores(root)
        added["OMP_NUM_THREADS"] = str(max(1, cores // max(1, processes)))
        shared = f", shared by {processes} processes" if processes > 1 else ""
        threads = f"{added['OMP_NUM_THREADS']} per process ({cores} usable cores: {found}{shared})"
    policy = environ.get("OMP_WAIT_POLICY", "").strip()
    if policy:
        wait = f"OMP_WAIT_POLICY={policy} (yours)"
    else:
        added["OMP_WAIT_POLICY"] = "PASSIVE"
        wait = ("idle OpenMP threads sleep (OMP_WAIT_POLICY=PASSIVE): a spinning one slows every step when another "
                "process shares the cores")  # fmt: skip
    line = f"threads: {threads}; {wait}"
    added[DECIDED] = line
    return added, line
