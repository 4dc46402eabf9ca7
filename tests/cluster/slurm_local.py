"""A throwaway Slurm cluster on this machine: one slurmctld and three slurmd (`-N`), each node claiming 8 GPUs.

Uses Debian's `slurm-wlm` binaries with auth/none, everything (config, state, logs, ports) under a temporary
folder, so nothing on the host is changed. The GPUs are count-only GRES: enough for Slurm to schedule
`--gpus-per-node`, never used.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

NODES = ["tk-n1", "tk-n2", "tk-n3"]
NODE_LIST = "tk-n[1-3]"
PARTITION = "debug"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def why_unavailable() -> str | None:
    """None when a local cluster can be tried, else the reason to skip."""
    missing = [tool for tool in ("slurmctld", "slurmd", "sbatch", "sinfo") if not shutil.which(tool)]
    if missing:
        return f"{', '.join(missing)} not installed (Debian: apt-get install slurm-wlm)"
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs"
    return None


class LocalSlurm:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.host = socket.gethostname()

    def write_config(self) -> None:
        for sub in ("state", "log", *[f"spool/{n}" for n in NODES]):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        r = self.root
        lines = [
            "ClusterName=trainkit-test",
            f"SlurmctldHost={self.host}",
            f"SlurmctldPort={free_port()}",
            "AuthType=auth/none",
            # a requeued job may start again once its credential expires (default 120 s): a quick requeue test
            "AuthInfo=cred_expire=10",
            "CredType=cred/none",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool/%n",
            f"SlurmctldPidFile={r}/slurmctld.pid",
            f"SlurmdPidFile={r}/slurmd-%n.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "GresTypes=gpu",
        ]
        lines += [
            f"NodeName={node} NodeHostname={self.host} Port={free_port()} CPUs=2 RealMemory=1000 Gres=gpu:8"
            for node in NODES
        ]
        lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        # slurmd counts GPUs from device paths; empty files stand in (never opened: TaskPlugin=task/none).
        devices = self.root / "dev"
        devices.mkdir(exist_ok=True)
        for index in range(8):
            (devices / f"nvidia{index}").touch()
        (self.root / "gres.conf").write_text(f"NodeName={NODE_LIST} Name=gpu File={devices}/nvidia[0-7]\n")

    def start(self, timeout_s: float = 60) -> None:
        self.write_config()
        self._run(["slurmctld", "-i"])
        for node in NODES:
            self._run(["slurmd", "-N", node])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = self._run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout.split()
            if states.count("idle") == len(NODES):
                return
            time.sleep(1)
        logs = "\n".join(
            line
            for p in sorted((self.root / "log").glob("*.log"))
            for line in p.read_text().splitlines()[-200:]
            if "error" in line and "pmix" not in line.lower() and "MPI" not in line
        )[-1500:]
        raise RuntimeError(f"local Slurm did not come up within {timeout_s}s:\n{logs}")

    def stop(self, timeout_s: float = 60) -> None:
        """Cancel what still runs (its slurmstepd would outlive the daemons), then stop the daemons."""
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._run(["scancel", "--user", "root"], check=False)
            deadline = time.monotonic() + timeout_s
            while self._run(["squeue", "-h"], check=False).stdout.strip() and time.monotonic() < deadline:
                time.sleep(1)
        for pid_file in self.root.glob("*.pid"):
            with contextlib.suppress(ValueError, ProcessLookupError):
                os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)

    def _run(self, cmd: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, check=check, timeout=60, **kw)
