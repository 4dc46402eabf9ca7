"""Stand-in bases for the CUDA rows: an NGC look-alike made from packages alone, for CI without NGC or a GPU.

`build.py --cuda X.Y --standin` builds `images/standin-base/Dockerfile` once per row (the tag carries a hash of
its inputs, so a changed input makes a new base and an unchanged one is reused), then the real Dockerfile on it.
The base: a root filesystem with the row's Python (the CPU flavor's Debian where its Python is the row's, else the
row's `rootfs`, e.g. Ubuntu 22.04 for the 3.10 rows), the PyPI torch build nearest to the row's torch with the same
CUDA major, a CUDA toolkit at /usr/local/cuda, and the NGC release's known clashing pins in a constraint file.
Inputs live in images/versions.toml (`[standin."X.Y"]` next to each row, `[standin_toolkit."X.Y"]`,
`[standin_rootfs.NAME]`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import docker
import tomllib
from buildkit import BuildSpec, run_build
from cpu_base import archive_keyring, build_rootfs, debootstrap_image, image_exists, rootfs_tag
from errors import UserError
from matrix import ROOT, VERSIONS_FILE, CpuFlavor, Entry, Matrix

SOURCE_DIR = ROOT / "images" / "standin-base"
WORK_DIR = ROOT / "build" / "standin-base"
ROOTFS_INPUTS = ("mirror", "components", "keyring")  # what makes a [standin_rootfs]'s filesystem (in the base's tag)


@dataclass(frozen=True)
class Standin:
    """One row's stand-in inputs."""

    cuda: str
    torch: str
    toolkit: str
    packages: tuple[str, ...]
    constraint_file: bool
    toolkit_wheels: tuple[str, ...]
    toolkit_debs: tuple[str, ...]
    deb_source: str
    python: str  # the base's Python: the row's where the root filesystem has it
    rootfs: str = ""  # a [standin_rootfs.NAME], or "" for the CPU flavor's Debian
    rootfs_inputs: tuple[tuple[str, str], ...] = ()  # its mirror, components, keyring

    @property
    def constrained(self) -> list[str]:
        return [p.split("==")[0] for p in self.packages]

    def digest(self, rootfs: str) -> str:
        recipe = (SOURCE_DIR / "Dockerfile").read_bytes() + (SOURCE_DIR / "cuda_home.py").read_bytes()
        data = json.dumps([asdict(self), rootfs], sort_keys=True).encode() + recipe
        return hashlib.sha256(data).hexdigest()[:10]


def load_standin(entry: Entry, path: Path = VERSIONS_FILE) -> Standin:
    """The `[standin."X.Y"]` inputs of `entry`, or a UserError naming the rows that have them."""
    data = tomllib.loads(path.read_text())
    rows = data.get("standin", {})
    if entry.name not in rows:
        raise UserError(
            f"CUDA {entry.cuda} has no stand-in base; rows with one: {', '.join(rows)}.\n"
            f"  Add a [standin.\"{entry.name}\"] table to images/versions.toml, or build on NGC (without --standin)."
        )
    row = rows[entry.name]
    toolkit = data["standin_toolkit"][row["toolkit"]]
    rootfs = data.get("standin_rootfs", {}).get(row.get("rootfs", ""), {})
    if row.get("rootfs") and not rootfs:
        raise UserError(f"[standin.\"{entry.cuda}\"] names rootfs = \"{row['rootfs']}\", which images/versions.toml "
                        f"has no [standin_rootfs.{row['rootfs']}] table for")  # fmt: skip
    inputs = tuple(sorted((k, json.dumps(v)) for k, v in rootfs.items() if k in ROOTFS_INPUTS))
    return Standin(
        cuda=entry.cuda, torch=row["torch"], toolkit=row["toolkit"], packages=tuple(row.get("packages", [])),
        constraint_file=row["constraint_file"], toolkit_wheels=tuple(toolkit.get("wheels", [])),
        toolkit_debs=tuple(toolkit.get("debs", [])), deb_source=toolkit.get("deb_source", ""),
        python=rootfs.get("python", data["cpu"]["python"]), rootfs=row.get("rootfs", ""), rootfs_inputs=inputs,
    )  # fmt: skip


def standin_rootfs_tag(standin: Standin, cpu: CpuFlavor) -> str:
    """The image the stand-in base builds FROM: its own root filesystem, or the CPU flavor's Debian one."""
    return f"trainkit-rootfs:{standin.rootfs}" if standin.rootfs else rootfs_tag(cpu)


def ensure_rootfs(client: docker.DockerClient, standin: Standin, cpu: CpuFlavor, on_line: Callable[[str], None]) -> str:
    """The stand-in's root filesystem image, made by debootstrap when missing (the CPU flavor's Debian is always
    made too: the toolkit's Debian packages are fetched and checked there, with Debian's archive keys)."""
    if not image_exists(client, rootfs_tag(cpu)):
        build_rootfs(client, cpu, on_line)
    tag = standin_rootfs_tag(standin, cpu)
    if not image_exists(client, tag):
        inputs = {key: json.loads(value) for key, value in standin.rootfs_inputs}
        keyring = inputs.get("keyring", "")
        if keyring:  # where this host lacks it: from the package the table names (how to get it, not what is built)
            table = tomllib.loads(VERSIONS_FILE.read_text())["standin_rootfs"][standin.rootfs]
            keyring = archive_keyring(keyring, table.get("keyring_package", ""), table.get("keyring_source", ""),
                                      on_line)  # fmt: skip
        debootstrap_image(client, standin.rootfs, inputs["mirror"], tag, on_line,
                          tuple(inputs.get("components", ())), keyring)  # fmt: skip
    return tag


def has_standin(entry: Entry, path: Path = VERSIONS_FILE) -> bool:
    return entry.name in tomllib.loads(path.read_text()).get("standin", {})


def standin_tag(matrix: Matrix, entry: Entry) -> str:
    standin = load_standin(entry)
    rootfs = standin_rootfs_tag(standin, matrix.cpu)
    row = f"{entry.key}-{entry.cuda_tag}" if entry.key else entry.cuda_tag
    return f"trainkit-base:standin-{row}-torch{standin.torch}-{standin.digest(rootfs)}"


def ensure_standin_base(
    client: docker.DockerClient,
    matrix: Matrix,
    entry: Entry,
    ca_cert: Path | None,
    on_line: Callable[[str], None],
    rebuild: bool = False,
) -> str:
    """The stand-in base's tag for `entry`, building it (and the Debian root filesystem) first when missing."""
    standin = load_standin(entry)
    tag = standin_tag(matrix, entry)
    if image_exists(client, tag) and not rebuild:
        return tag
    rootfs = ensure_rootfs(client, standin, matrix.cpu, on_line)
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    shutil.copy2(ROOT / "images" / "with-ca.sh", WORK_DIR / "with-ca.sh")
    shutil.copy2(SOURCE_DIR / "cuda_home.py", WORK_DIR / "cuda_home.py")
    spec = BuildSpec(
        context=WORK_DIR,
        dockerfile=SOURCE_DIR / "Dockerfile",
        tags=[tag],
        args={
            "ROOTFS_IMAGE": rootfs,
            "DEBIAN_ROOTFS_IMAGE": rootfs_tag(matrix.cpu),
            "PYTHON_VERSION": standin.python,
            "TORCH_VERSION": standin.torch,
            "PYTHON_PACKAGES": " ".join(standin.packages),
            "TOOLKIT_WHEELS": " ".join(standin.toolkit_wheels),
            "TOOLKIT_DEBS": " ".join(standin.toolkit_debs),
            "TOOLKIT_DEB_SOURCE": standin.deb_source,
            "CONSTRAINED": " ".join(standin.constrained),
        },
        labels={
            "org.trainkit.standin": "true",
            "org.trainkit.standin.for-ngc": entry.ngc,
            "org.trainkit.standin.for": entry.base_image,
            "org.trainkit.standin.torch": standin.torch,
            "org.trainkit.standin.python": standin.python,
            "org.trainkit.standin.rootfs": rootfs,
            "org.trainkit.standin.cuda-toolkit": standin.toolkit,
            "org.trainkit.standin.constraint-file": str(standin.constraint_file).lower(),
        },
        ca_cert=ca_cert,
        target="with-constraint" if standin.constraint_file else "no-constraint",
    )
    run_build(spec, on_line)
    on_line(f"built the stand-in base {tag}")
    return tag
