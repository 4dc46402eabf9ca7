"""The CPU cores this process really has: its affinity, capped by its cgroup's CPU quota. Without torch.

A container started with `--cpus 1` on a 2-core machine sees both cores in its affinity (and torch, left alone, starts
two threads), but its cgroup lets it use one core's time per period: two threads then take turns being throttled, and
each waits at every parallel region for the other. The quota is the cgroup's `cpu.max` (v2) or
`cpu.cfs_quota_us`/`cpu.cfs_period_us` (v1), read from the process's own cgroup root.
"""

from __future__ import annotations

import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cpu_quota(root: Path = CGROUP_ROOT) -> tuple[float, str] | None:
    """(cores' worth of CPU time the cgroup allows, where that was read), None where there is no quota."""
    v2 = _read(root / "cpu.max")
    if v2:
        quota, _, period = v2.partition(" ")
        if quota == "max" or not period:
            return None
        return int(quota) / int(period), f"cgroup cpu.max {quota} {period}"
    for folder in (root / "cpu", root / "cpu,cpuacct"):
        cfs, period_us = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
        if cfs and period_us and int(cfs) > 0:
            return int(cfs) / int(period_us), f"cgroup cpu.cfs_quota_us {cfs} / cpu.cfs_period_us {period_us}"
    return None


def usable_cores(root: Path = CGROUP_ROOT) -> tuple[int, str]:
    """(whole cores this process can keep busy, how that was found): the affinity's count, lowered to the cores a
    CPU quota pays for (at least 1)."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    found = f"{affinity} in this process's CPU affinity"
    quota = cpu_quota(root)
    if quota is None:
        return affinity, found + ", no CPU quota"
    allowed, where = quota
    if int(allowed) >= affinity:
        return affinity, f"{found}; the CPU quota ({where}) allows {allowed:g}"
    return max(1, int(allowed)), f"{found}, but its CPU quota ({where}) pays for {allowed:g} cores"
