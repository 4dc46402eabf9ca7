"""`--cuda auto`: read the host's NVIDIA driver and pick the newest matrix row it can run.

The driver is read through NVML (the `nvidia-ml-py` package) where it is installed and a driver answers,
otherwise from `nvidia-smi`. Host side: no torch, no docker SDK.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from errors import UserError, exit_missing_package
from matrix import Entry, Matrix

try:  # the installed project; the driver -> row rule is the doctor's, torch-free
    from trainer.doctor.driver import newest_row_for, version_key
except ModuleNotFoundError as missing:
    exit_missing_package(missing)


@dataclass(frozen=True)
class DriverReport:
    version: str
    gpus: tuple[str, ...]
    source: str  # "NVML" or "nvidia-smi"


def _from_nvml() -> DriverReport | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
        names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                 for i in range(pynvml.nvmlDeviceGetCount())]  # fmt: skip
    finally:
        pynvml.nvmlShutdown()
    as_text = [n.decode() if isinstance(n, bytes) else n for n in names]
    return DriverReport(version.decode() if isinstance(version, bytes) else version, tuple(as_text), "NVML")


def _from_nvidia_smi() -> DriverReport | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version,name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    rows = [[cell.strip() for cell in line.split(",", 1)] for line in out.stdout.splitlines() if line.strip()]
    if out.returncode != 0 or not rows:
        return None
    return DriverReport(rows[0][0], tuple(row[1] if len(row) > 1 else "" for row in rows), "nvidia-smi")


def read_driver() -> DriverReport | None:
    """The host's driver, or None where no NVIDIA driver answers."""
    return _from_nvml() or _from_nvidia_smi()


def pick_entry(matrix: Matrix, driver: str) -> tuple[Entry, str]:
    """The newest row whose driver floor `driver` meets, and why; a UserError when none does. A row whose facts
    are verified wins over a newer unverified one (its first real build may stop at the base check); an unverified
    row only where no verified one fits the driver."""
    entries = matrix.entries.values()
    cuda = (newest_row_for(driver, {e.cuda: e.driver_min for e in entries if e.verified})
            or newest_row_for(driver, {e.cuda: e.driver_min for e in entries}))  # fmt: skip
    if cuda is None:
        oldest = min(matrix.entries.values(), key=lambda e: version_key(e.driver_min))
        raise UserError(
            f"driver {driver} is older than every row's floor (the oldest, CUDA {oldest.cuda}, needs "
            f">= {oldest.driver_min}).\n  Update the driver, or on datacenter GPUs install the CUDA forward "
            "compatibility package and pass --cuda X.Y explicitly."
        )
    best = matrix.entries[cuda]
    newer = [e for e in matrix.entries.values() if version_key(e.cuda) > version_key(best.cuda)]
    why = f"driver {driver} meets CUDA {best.cuda}'s floor (>= {best.driver_min})"
    unverified = [e.cuda for e in newer if not e.verified and version_key(e.driver_min) <= version_key(driver)]
    if unverified:
        why += (f"; CUDA {', '.join(unverified)} also fit(s) the driver, but the row's facts are unverified (pass "
                "--cuda X.Y to build one: its base is checked against them)")
    newer = [e for e in newer if version_key(e.driver_min) > version_key(driver)]
    if newer:
        nxt = min(newer, key=lambda e: version_key(e.cuda))
        why += f"; CUDA {nxt.cuda} needs >= {nxt.driver_min}"
    return best, why


def auto_entry(matrix: Matrix) -> tuple[Entry, str]:
    """`--cuda auto`: the row for this host's driver, with the reason to print."""
    report = read_driver()
    if report is None:
        rows = ", ".join(f"{e.cuda} (driver >= {e.driver_min})" for e in matrix.entries.values())
        raise UserError(
            "--cuda auto found no NVIDIA driver on this machine (no NVML, no working nvidia-smi).\n"
            f"  Name the row for the machines that will run the image with --cuda X.Y: {rows}."
        )
    entry, why = pick_entry(matrix, report.version)
    gpus = f" on {len(report.gpus)} x {report.gpus[0]}" if report.gpus and report.gpus[0] else ""
    return entry, f"--cuda auto: {why} (read via {report.source}{gpus})"
