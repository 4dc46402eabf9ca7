"""The launcher's rendezvous host: the first host of Slurm's nodelist, expanded by python-hostlist."""

from __future__ import annotations

import pytest

from trainer.launch.placement import LaunchError, first_host


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [
        ("node1", "node1"),
        ("node[01-03,7]", "node01"),
        ("gpu-a[07-08],gpu-b3", "gpu-a07"),
        ("n[098-101]", "n098"),
        ("rack[1-2]-n[1-2]", "rack1-n1"),
        ("dgx-h100-[5]", "dgx-h100-5"),
        ("10.0.0.[1-2]", "10.0.0.1"),
        (" tk-n[1-3]\n", "tk-n1"),
    ],
)
def test_first_host(nodelist: str, first: str) -> None:
    assert first_host(nodelist, "SLURM_JOB_NODELIST") == first


@pytest.mark.parametrize("bad", ["node[1-", "node]1[", "node[3-1]", "node[a-b]", "node[[1]]", "", " , "])
def test_bad_nodelists_name_the_variable(bad: str) -> None:
    with pytest.raises(LaunchError, match="SLURM_JOB_NODELIST"):
        first_host(bad, "SLURM_JOB_NODELIST")
