"""The local Slurm cluster, started once per test session for the tests that need one."""

from __future__ import annotations

import subprocess

import pytest
from slurm_local import LocalSlurm, why_unavailable


@pytest.fixture(scope="session")
def local_slurm(tmp_path_factory: pytest.TempPathFactory):
    reason = why_unavailable()
    if reason:
        pytest.skip(f"no local Slurm: {reason}")
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except (RuntimeError, subprocess.SubprocessError) as exc:
        cluster.stop()
        pytest.skip(f"local slurmctld/slurmd did not start: {exc}")
    yield cluster
    cluster.stop()
