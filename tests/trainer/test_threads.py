"""The thread rule (trainer/machine/threads.py) on cgroup files as the kernel writes them: the cores a process really
has (its affinity, lowered by a CPU quota: cgroup v2's cpu.max, v1's cfs files), OMP_NUM_THREADS from them and
OpenMP's passive wait unless the user set either, shared among a node's processes, decided once (the launcher's line
carried to its workers). The container's real quota: tests/images/test_cpu_image.py; the line a run logs:
test_outputs.py; docs/running.md ("CPU threads") has the measurement behind the wait policy."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainer.machine.cores import cpu_quota, usable_cores
from trainer.machine.threads import DECIDED, thread_env

CORES = len(os.sched_getaffinity(0))


def cgroup(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text + "\n")
    return tmp_path


def test_no_quota_leaves_the_affinity(tmp_path: Path) -> None:
    for files in ({}, {"cpu.max": "max 100000"}, {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}):
        root = cgroup(tmp_path / str(len(files)), files)
        assert cpu_quota(root) is None
        assert usable_cores(root) == (CORES, f"{CORES} in this process's CPU affinity, no CPU quota")


@pytest.mark.parametrize(("files", "where"), [
    ({"cpu.max": "100000 100000"}, "cgroup cpu.max 100000 100000"),
    ({"cpu,cpuacct/cpu.cfs_quota_us": "50000", "cpu,cpuacct/cpu.cfs_period_us": "100000"},
     "cgroup cpu.cfs_quota_us 50000 / cpu.cfs_period_us 100000"),
], ids=["v2", "v1-half-a-core"])  # fmt: skip
def test_a_quota_below_the_affinity_lowers_the_threads(tmp_path: Path, files: dict[str, str], where: str) -> None:
    root = cgroup(tmp_path, files)
    allowed = cpu_quota(root)[0]
    cores, found = usable_cores(root)
    if allowed >= CORES:
        pytest.skip(f"this machine has {CORES} core(s): a quota of {allowed:g} is not below it")
    assert cores == 1 and f"its CPU quota ({where}) pays for {allowed:g} cores" in found, found
    added, line = thread_env({}, root=root)
    assert added["OMP_NUM_THREADS"] == "1" and line.startswith("threads: 1 per process (1 usable cores:"), line


def test_a_quota_above_the_affinity_changes_nothing(tmp_path: Path) -> None:
    root = cgroup(tmp_path, {"cpu.max": f"{(CORES + 2) * 100000} 100000"})
    assert usable_cores(root)[0] == CORES


def test_the_decision_sets_threads_and_a_passive_wait_and_says_why(tmp_path: Path) -> None:
    added, line = thread_env({}, root=tmp_path)
    assert added == {"OMP_NUM_THREADS": str(CORES), "OMP_WAIT_POLICY": "PASSIVE", DECIDED: line}
    assert line == (f"threads: {CORES} per process ({CORES} usable cores: {CORES} in this process's CPU affinity, no "
                    "CPU quota); idle OpenMP threads sleep (OMP_WAIT_POLICY=PASSIVE): a spinning one slows every step "
                    "when another process shares the cores")  # fmt: skip
    shared, line = thread_env({}, processes=CORES * 2, root=tmp_path)  # never below one thread
    assert shared["OMP_NUM_THREADS"] == "1" and f"shared by {CORES * 2} processes" in line, line


def test_the_users_variables_are_kept_and_named_as_theirs(tmp_path: Path) -> None:
    added, line = thread_env({"OMP_NUM_THREADS": "3", "OMP_WAIT_POLICY": "ACTIVE"}, root=tmp_path)
    assert added == {DECIDED: line}
    assert line == "threads: 3 per process (OMP_NUM_THREADS=3, yours); OMP_WAIT_POLICY=ACTIVE (yours)"


def test_a_process_the_launcher_decided_for_keeps_its_line(tmp_path: Path) -> None:
    """A torchrun worker: the launcher's variables and line came with its environment; nothing is decided again
    (OMP_NUM_THREADS there is the launcher's, not the user's)."""
    decided, line = thread_env({}, processes=2, root=tmp_path)
    assert thread_env(decided, processes=2, root=tmp_path) == ({}, line)
