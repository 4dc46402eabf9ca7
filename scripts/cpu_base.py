"""The CPU flavor's base image, made without any container registry.

1. A Debian root filesystem from `debootstrap` (Python, pip, g++, ninja, libaio, ccache), imported as
   `trainkit-rootfs:<suite>`.
2. `images/cpu-base/Dockerfile` on top of it: a CPU torch wheel (downloaded on the host with pip) and an
   NGC-style `/etc/pip/constraint.txt` pinning that torch, tagged `trainkit-base:cpu-...`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import docker
from buildkit import BuildSpec, run_build
from errors import UserError
from matrix import ROOT, CpuFlavor

ROOTFS_PACKAGES = [
    "python3", "python3-pip", "python3-venv", "python3-dev", "python-is-python3",
    "g++", "make", "ninja-build", "git", "ca-certificates", "libaio-dev", "ccache",
]  # fmt: skip
WORK_DIR = ROOT / "build" / "cpu-base"


def image_exists(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def rootfs_tag(cpu: CpuFlavor) -> str:
    return f"trainkit-rootfs:{cpu.debian_suite}"


def check_debootstrap() -> str:
    """The debootstrap command, or a UserError saying how to get it and why root is needed."""
    path = shutil.which("debootstrap") or next(
        (p for p in ("/usr/sbin/debootstrap", "/sbin/debootstrap") if Path(p).exists()), None
    )
    if path is None:
        raise UserError(
            "debootstrap is missing: the CPU base is made from Debian packages, without any registry.\n"
            "  Install it (`sudo apt-get install debootstrap`), then run `python scripts/build.py --cpu` again."
        )
    if os.geteuid() != 0:
        raise UserError(
            "making the CPU base's Debian root filesystem needs root (debootstrap creates device files and "
            "chroots).\n  Run `sudo python scripts/build.py --cpu` once; later builds reuse the base image."
        )
    return path


def build_rootfs(client: docker.DockerClient, cpu: CpuFlavor, on_line: Callable[[str], None]) -> str:
    """debootstrap a minimal Debian and import it as an image; return its tag."""
    debootstrap = check_debootstrap()
    tag = rootfs_tag(cpu)
    with tempfile.TemporaryDirectory(prefix="trainkit-rootfs-") as tmp:
        target = Path(tmp, "rootfs")
        argv = [
            debootstrap, "--variant=minbase", f"--include={','.join(ROOTFS_PACKAGES)}",
            cpu.debian_suite, str(target), cpu.debian_mirror,
        ]  # fmt: skip
        _run_logged(argv, on_line, "debootstrap")
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for item in (target / leftover).glob("*"):
                if item.is_file():
                    item.unlink()
        tarball = Path(tmp, "rootfs.tar")
        _run_logged(["tar", "--numeric-owner", "-C", str(target), "-cf", str(tarball), "."], on_line, "tar")
        repository, _, version = tag.partition(":")
        with tarball.open("rb") as fh:
            client.api.import_image_from_data(fh, repository=repository, tag=version)
    on_line(f"imported {tag}")
    return tag


def download_torch(cpu: CpuFlavor, on_line: Callable[[str], None]) -> Path:
    """The CPU torch wheel for the base's Python, fetched once into build/cpu-base/wheels."""
    wheels = WORK_DIR / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob(f"torch-{cpu.torch}*.whl"))
    if found:
        return found[0]
    py = cpu.python.replace(".", "")
    argv = [
        "python3", "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(wheels),
        "--python-version", py, "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
        "--extra-index-url", cpu.torch_index, f"torch=={cpu.torch}+cpu",
    ]  # fmt: skip
    _run_logged(argv, on_line, "pip download torch")
    found = sorted(wheels.glob(f"torch-{cpu.torch}*.whl"))
    if not found:
        raise UserError(f"pip did not fetch a CPU torch {cpu.torch} wheel; check access to {cpu.torch_index}")
    return found[0]


def ensure_cpu_base(
    client: docker.DockerClient,
    cpu: CpuFlavor,
    ca_cert: Path | None,
    on_line: Callable[[str], None],
    rebuild: bool = False,
) -> str:
    """The CPU base's tag, building it (and its root filesystem) first when missing."""
    if image_exists(client, cpu.base_image) and not rebuild:
        return cpu.base_image
    if not image_exists(client, rootfs_tag(cpu)):
        build_rootfs(client, cpu, on_line)
    download_torch(cpu, on_line)
    shutil.copy2(ROOT / "images" / "with-ca.sh", WORK_DIR / "with-ca.sh")
    spec = BuildSpec(
        context=WORK_DIR,
        dockerfile=ROOT / "images" / "cpu-base" / "Dockerfile",
        tags=[cpu.base_image],
        args={"ROOTFS_IMAGE": rootfs_tag(cpu), "TORCH_VERSION": cpu.torch},
        labels={"org.trainkit.base.torch": cpu.torch, "org.trainkit.base.debian": cpu.debian_suite},
        ca_cert=ca_cert,
    )
    run_build(spec, on_line)
    return cpu.base_image


def _run_logged(argv: list[str], on_line: Callable[[str], None], what: str) -> None:
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        tail = []
        for raw in proc.stdout:
            tail = [*tail[-19:], raw.rstrip()]
            on_line(raw.rstrip())
        if proc.wait() != 0:
            raise UserError(f"{what} failed (exit {proc.returncode}):\n  " + "\n  ".join(tail))
