"""Images between this engine, registries and offline sites: push with digests, pull and check, pin by digest.

A job that names `repo@sha256:...` runs the same bytes on every node and after every restart; a tag can move.
"""

from __future__ import annotations

import re
from pathlib import Path

import docker
from errors import UserError
from matrix import CPU_RL_ROW, REPOSITORY, RL_ROW, Matrix
from rich.console import Console

console = Console(stderr=True)
DIGEST_REF = re.compile(r"^(?P<repo>[^@\s]+)@(?P<digest>sha256:[0-9a-f]{64})$")


def split_tag(ref: str) -> tuple[str, str]:
    """'host:5000/trainkit:0.1.0-cpu' -> ('host:5000/trainkit', '0.1.0-cpu'); no tag means 'latest'."""
    name, _, tag = ref.rpartition(":")
    if not name or "/" in tag:  # the colon belonged to a registry port
        return ref, "latest"
    return name, tag


def push(client: docker.DockerClient, tags: list[str]) -> dict[str, str]:
    """Push each tag; return tag -> the pushed `repo@sha256:...` reference."""
    pushed = {}
    for tag in tags:
        repository, name = split_tag(tag)
        with console.status(f"pushing {tag}"):
            for event in client.images.push(repository, name, stream=True, decode=True):
                if "error" in event:
                    raise UserError(f"pushing {tag} failed: {event['error']}\n  Logged in to the registry "
                                    f"(`docker login {repository.split('/')[0]}`)? Is it reachable?")  # fmt: skip
                digest = (event.get("aux") or {}).get("Digest")
                if digest:
                    pushed[tag] = f"{repository}@{digest}"
        if tag not in pushed:
            raise UserError(f"pushing {tag} reported no digest; the registry did not confirm the upload")
    return pushed


def resolve_digest(client: docker.DockerClient, ref: str) -> str:
    """`ref` pinned as `repo@sha256:...`: kept if it already is, else the registry's digest for the tag."""
    if DIGEST_REF.match(ref):
        return ref
    repository, _ = split_tag(ref)
    try:
        local = client.images.get(ref).attrs.get("RepoDigests") or []
    except docker.errors.ImageNotFound:
        local = []
    for candidate in local:
        if candidate.startswith(repository + "@"):
            return candidate
    try:
        return f"{repository}@{client.images.get_registry_data(ref).id}"
    except docker.errors.APIError as exc:
        raise UserError(
            f"cannot pin {ref} to a digest: no registry answers for it ({exc.explanation or exc}).\n"
            "  Cluster nodes pull from a registry: push the image first "
            "(`python scripts/build.py --registry R --push`) and name the pushed tag or its repo@sha256:... digest."
        ) from None


def expected_labels(matrix: Matrix, labels: dict[str, str]) -> dict[str, str]:
    """The labels the matrix says an image of this version, flavor and CUDA row must carry."""
    if labels.get("org.opencontainers.image.title") != REPOSITORY:
        raise UserError("the image is not a trainkit image (label org.opencontainers.image.title is "
                        f"{labels.get('org.opencontainers.image.title')!r})")  # fmt: skip
    version = labels.get("org.opencontainers.image.version")
    if version != matrix.version:
        raise UserError(f"the image is trainkit {version}; this checkout describes trainkit {matrix.version}.\n"
                        "  Check out the matching release, or pull an image of this version.")  # fmt: skip
    cuda = labels.get("org.trainkit.cuda", "none")
    if labels.get("org.trainkit.row") == RL_ROW and matrix.rl:
        pins = matrix.rl.packages
    elif labels.get("org.trainkit.row") == CPU_RL_ROW and matrix.cpu_rl:
        pins = matrix.cpu_rl.packages
    elif labels.get("org.trainkit.flavor") == "cpu" or cuda == "none":
        pins = matrix.cpu.packages
    elif cuda in matrix.entries:
        pins = matrix.entries[cuda].packages
    else:
        raise UserError(f"the image says CUDA {cuda}, which is not a row of images/versions.toml "
                        f"({', '.join(matrix.entries)})")  # fmt: skip
    return {f"org.trainkit.pin.{pkg}": version for pkg, version in pins.items()}


def label_agrees(label: str | None, pinned: str) -> bool:
    """A pin label names the version read in the image (a local build of the pinned release may add +cpu), or
    `skipped: <reason>` where the build left the package out (flash-attn on the CPU flavor)."""
    return label is not None and (label.split("+")[0] == pinned or label.startswith("skipped: "))


def check_labels(matrix: Matrix, ref: str, labels: dict[str, str]) -> None:
    """A UserError naming every label of `ref` that disagrees with the matrix."""
    expected = expected_labels(matrix, labels)
    wrong = [f"{key}={labels.get(key)!r} (matrix: {want!r})"
             for key, want in expected.items() if not label_agrees(labels.get(key), want)]  # fmt: skip
    if wrong:
        raise UserError(f"{ref} does not match images/versions.toml:\n  " + "\n  ".join(wrong))


def pull(client: docker.DockerClient, ref: str, matrix: Matrix) -> docker.models.images.Image:
    """Pull `ref` (a tag or repo@sha256:...) and check its labels against the matrix before it is used."""
    repository, tag = (ref.split("@", 1) if "@" in ref else split_tag(ref))
    try:
        with console.status(f"pulling {ref}"):
            image = client.images.pull(repository, tag=tag)
    except docker.errors.APIError as exc:
        raise UserError(f"cannot pull {ref}: {exc.explanation or exc}\n"
                        "  Check the name, that the registry is reachable, and `docker login`.") from None  # fmt: skip
    check_labels(matrix, ref, image.labels)
    return image


def save(client: docker.DockerClient, ref: str, archive: Path) -> str:
    """`docker save` `ref` to `archive`; return the Apptainer command that makes a .sif from it."""
    image = client.images.get(ref)
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    with partial.open("wb") as fh:
        for chunk in image.save(named=ref if ref in image.tags else True):
            fh.write(chunk)
    partial.replace(archive)
    return f"apptainer build {archive.with_suffix('.sif').name} docker-archive://{archive}"


def load(client: docker.DockerClient, archive: Path) -> list[str]:
    """`docker load` an archive written by `save`; return the tags it brought."""
    if not archive.is_file():
        raise UserError(f"--load {archive}: no such file (write one with `python scripts/build.py --save FILE`)")
    with archive.open("rb") as fh:
        images = client.images.load(fh)
    return [tag for image in images for tag in image.tags]
