"""Slurm hostlist expansion, checked against what `scontrol show hostnames` prints for the same input."""

from __future__ import annotations

import pytest

from trainer.hostlist import HostlistError, expand_hostlist, first_host


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[01-03,7]", ["node01", "node02", "node03", "node7"]),
        ("node[01-03,7],gpu-a[1-2]", ["node01", "node02", "node03", "node7", "gpu-a1", "gpu-a2"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("a,b , c", ["a", "b", "c"]),
        ("dgx-h100-[5]", ["dgx-h100-5"]),
        ("10.0.0.[1-2]", ["10.0.0.1", "10.0.0.2"]),
    ],
)
def test_expand(hostlist: str, hosts: list[str]) -> None:
    assert expand_hostlist(hostlist) == hosts
    assert first_host(hostlist) == hosts[0]


@pytest.mark.parametrize("bad", ["node[1-", "node]1[", "node[3-1]", "node[a-b]", "node[[1]]", "", " , "])
def test_bad_hostlists_are_named(bad: str) -> None:
    with pytest.raises(HostlistError, match="hostlist"):
        expand_hostlist(bad)


def test_first_host_does_not_expand_huge_lists() -> None:
    assert first_host("n[000000-999999],m[1-999999]") == "n000000"
    with pytest.raises(HostlistError, match="more than"):
        expand_hostlist("r[1-9999]n[1-9999]")
