"""run.py's device passthrough: /dev/infiniband with IPC_LOCK where the host has it, nothing elsewhere."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from devices import rdma_passthrough  # noqa: E402


def test_rdma_devices_pass_through_where_the_host_has_them(tmp_path: Path) -> None:
    ib = tmp_path / "infiniband"
    assert rdma_passthrough(ib) == {}
    ib.mkdir()
    assert rdma_passthrough(ib) == {"devices": [f"{ib}:{ib}:rwm"], "cap_add": ["IPC_LOCK"]}
