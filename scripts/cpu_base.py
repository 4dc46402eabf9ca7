"""The CPU flavor's base image: Debian from a registry where one answers, else made without any registry.

1. The Debian image: `debian:bookworm-slim@sha256:...` (versions.toml `debian_image`; TRAINKIT_DEBIAN_IMAGE names a
   mirror or a site registry) where a registry answers. Only where none does (air-gapped sites, this project's own
   machines): a Debian root filesystem from `debootstrap`, imported as `trainkit-rootfs:<suite>`. Which path was
   taken is said, and recorded in the base's label org.trainkit.base.from.
2. `images/cpu-base/Dockerfile` on top of either: the packages the build needs (Python, pip, g++, ninja, libaio,
   ccache; already in the debootstrap root filesystem), a CPU torch wheel (downloaded on the host with pip) and an
   NGC-style `/etc/pip/constraint.txt` pinning that torch, tagged `trainkit-base:cpu-...`. The tag names the suite,
   Python and torch; the label org.trainkit.base.recipe names everything else the base is made of, so a base an older
   checkout made (an engine kept between runs, as on CI machines) is remade instead of trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict
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
KEYRING_DIR = ROOT / "build" / "keyrings"  # archive keyrings this host lacks, from its distribution's packages
DEBIAN_IMAGE_ENV = "TRAINKIT_DEBIAN_IMAGE"
BASE_FROM_LABEL = "org.trainkit.base.from"  # the Debian the base was made from: a registry ref or the debootstrap one
RECIPE_LABEL = "org.trainkit.base.recipe"  # digest of what makes the base; a different one means remake it
RECIPE_FILES = (ROOT / "images" / "cpu-base" / "Dockerfile", ROOT / "images" / "with-ca.sh")


def image_exists(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def rootfs_tag(cpu: CpuFlavor) -> str:
    return f"trainkit-rootfs:{cpu.debian_suite}"


def check_debootstrap() -> str:
    """The debootstrap command on PATH, or a UserError saying why root is needed or how to get it."""
    if os.geteuid() != 0:
        raise UserError(
            "making the CPU base's Debian root filesystem needs root (debootstrap creates device files and "
            "chroots).\n  Run `sudo python scripts/build.py --cpu` once; later builds reuse the base image."
        )
    path = shutil.which("debootstrap")
    if path is None:
        raise UserError(
            "debootstrap is missing (not on PATH): the CPU base is made from Debian packages, without any registry."
            "\n  Install it (`sudo apt-get install debootstrap`), then run this command again."
        )
    return path


def build_rootfs(client: docker.DockerClient, cpu: CpuFlavor, on_line: Callable[[str], None]) -> str:
    """debootstrap the CPU flavor's minimal Debian and import it as an image; return its tag."""
    return debootstrap_image(client, cpu.debian_suite, cpu.debian_mirror, rootfs_tag(cpu), on_line)


def debootstrap_image(
    client: docker.DockerClient,
    suite: str,
    mirror: str,
    tag: str,
    on_line: Callable[[str], None],
    components: tuple[str, ...] = (),
    keyring: str = "",
) -> str:
    """debootstrap a minimal `suite` (Debian, or Ubuntu with its `keyring`) with ROOTFS_PACKAGES, import it as `tag`."""
    debootstrap = check_debootstrap()
    with tempfile.TemporaryDirectory(prefix="trainkit-rootfs-") as tmp:
        target = Path(tmp, "rootfs")
        argv = [
            debootstrap, "--variant=minbase", f"--include={','.join(ROOTFS_PACKAGES)}",
            *([f"--components={','.join(components)}"] if components else []),
            *([f"--keyring={keyring}"] if keyring else []),
            suite, str(target), mirror,
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


def archive_keyring(keyring: str, package: str, source: str, on_line: Callable[[str], None]) -> str:
    """`keyring` where this host has it; else the same file from `package`, which apt-get downloads from `source` (a
    sources.list line of the host's own distribution, so the host's archive keys check it) into build/keyrings."""
    if Path(keyring).is_file():
        return keyring
    found = KEYRING_DIR / Path(keyring).name
    if found.is_file():
        return str(found)
    if not (package and source and shutil.which("apt-get")):
        raise UserError(
            f"{keyring} is missing: debootstrap checks the root filesystem's archive with it.\n  Install the package "
            f"that holds it ({package or 'the archive keyring'}), then run this command again."
        )
    with tempfile.TemporaryDirectory(prefix="trainkit-keyring-") as tmp:
        apt = Path(tmp)
        (apt / "lists" / "partial").mkdir(parents=True)
        (apt / "sources.list").write_text(source + "\n")
        options = [
            f"-oDir::Etc::sourcelist={apt}/sources.list", "-oDir::Etc::sourceparts=-",
            f"-oDir::State::Lists={apt}/lists", f"-oDir::Cache={apt}/cache", "-oAPT::Sandbox::User=root",
        ]  # fmt: skip
        _run_logged(["apt-get", *options, "update"], on_line, f"apt-get update ({source})")
        _run_logged(["apt-get", *options, "download", package], on_line, f"apt-get download {package}", cwd=apt)
        deb = next(apt.glob("*.deb"))
        _run_logged(["dpkg-deb", "-x", str(deb), str(apt / "root")], on_line, f"dpkg-deb -x {deb.name}")
        deb.unlink()
        KEYRING_DIR.mkdir(parents=True, exist_ok=True)
        shutil.copy2(apt / "root" / keyring.lstrip("/"), found)
    on_line(f"{keyring}: from {package} ({source})")
    return str(found)


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


def debian_image(cpu: CpuFlavor) -> str:
    """The registry Debian image the base builds FROM: TRAINKIT_DEBIAN_IMAGE (a mirror) or versions.toml's pin."""
    return os.environ.get(DEBIAN_IMAGE_ENV) or cpu.debian_image


def pull_debian(client: docker.DockerClient, ref: str) -> str | None:
    """None when `ref` is here (pulled now or before), else why no registry gave it."""
    if image_exists(client, ref):
        return None
    repository, tag = ref.split("@", 1) if "@" in ref else ref.rsplit(":", 1)
    try:
        client.images.pull(repository, tag=tag)
    except docker.errors.APIError as exc:
        return str(exc.explanation or exc).splitlines()[0][:200]
    return None


def root_image(client: docker.DockerClient, cpu: CpuFlavor, on_line: Callable[[str], None]) -> tuple[str, str]:
    """(the image the base builds FROM, which path that is): the registry's Debian, else the debootstrap one."""
    ref = debian_image(cpu)
    why = pull_debian(client, ref)
    if why is None:
        return ref, f"FROM {ref} (a registry answered)"
    fallback = f"no registry answered for {ref} ({why})"
    tag = rootfs_tag(cpu)
    if not image_exists(client, tag):
        try:
            build_rootfs(client, cpu, on_line)
        except UserError as exc:
            raise UserError(
                f"the CPU base needs Debian: {fallback}, and the fallback failed: {exc}\n  Either make a registry "
                f"reachable (a mirror or site registry: {DEBIAN_IMAGE_ENV}=host/debian:{cpu.debian_suite}-slim@sha256:"
                "...), or install debootstrap and run as root."
            ) from None
    return tag, f"FROM {tag}, a Debian root filesystem made by debootstrap ({fallback})"


def recipe_digest(cpu: CpuFlavor) -> str:
    """What the base is made of: the CPU flavor's own fields (not the image's pins), the Debian packages, the labels
    it carries and the recipe files."""
    flavor = {key: value for key, value in asdict(cpu).items() if key != "packages"}
    inputs = json.dumps([flavor, ROOTFS_PACKAGES, sorted(base_labels(cpu, root=""))], sort_keys=True).encode()
    return hashlib.sha256(inputs + b"".join(path.read_bytes() for path in RECIPE_FILES)).hexdigest()[:12]


def base_labels(cpu: CpuFlavor, root: str) -> dict[str, str]:
    return {"org.trainkit.base.torch": cpu.torch, "org.trainkit.base.debian": cpu.debian_suite, BASE_FROM_LABEL: root}


def stale_reason(client: docker.DockerClient, tag: str, cpu: CpuFlavor) -> str | None:
    """None when `tag` is here and made by today's recipe; else why it has to be made."""
    try:
        labels = client.images.get(tag).labels or {}
    except docker.errors.ImageNotFound:
        return "missing"
    made_by, today = labels.get(RECIPE_LABEL), recipe_digest(cpu)
    if made_by == today:
        return None
    return f"made by another recipe ({made_by or 'one without a recipe label'}, today's is {today})"


def ensure_cpu_base(
    client: docker.DockerClient,
    cpu: CpuFlavor,
    ca_cert: Path | None,
    on_line: Callable[[str], None],
    rebuild: bool = False,
    tag: str | None = None,
) -> str:
    """The CPU base's tag (`tag`, default the matrix's), building it first when missing or made by another recipe;
    says why it builds and which path it took."""
    tag = tag or cpu.base_image
    why = "--rebuild-base" if rebuild else stale_reason(client, tag, cpu)
    if why is None:
        return tag
    if why != "missing":
        print(f"CPU base {tag}: remade ({why})", file=sys.stderr, flush=True)
    root, path = root_image(client, cpu, on_line)
    print(f"CPU base: {path}", file=sys.stderr, flush=True)
    download_torch(cpu, on_line)
    shutil.copy2(ROOT / "images" / "with-ca.sh", WORK_DIR / "with-ca.sh")
    spec = BuildSpec(
        context=WORK_DIR,
        dockerfile=ROOT / "images" / "cpu-base" / "Dockerfile",
        tags=[tag],
        args={"ROOTFS_IMAGE": root, "TORCH_VERSION": cpu.torch, "PACKAGES": " ".join(ROOTFS_PACKAGES)},
        labels={**base_labels(cpu, root), RECIPE_LABEL: recipe_digest(cpu)},
        ca_cert=ca_cert,
    )
    run_build(spec, on_line)
    return tag


def _run_logged(argv: list[str], on_line: Callable[[str], None], what: str, cwd: Path | None = None) -> None:
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd) as proc:
        assert proc.stdout is not None
        tail = []
        for raw in proc.stdout:
            tail = [*tail[-19:], raw.rstrip()]
            on_line(raw.rstrip())
        if proc.wait() != 0:
            raise UserError(f"{what} failed (exit {proc.returncode}):\n  " + "\n  ".join(tail))
