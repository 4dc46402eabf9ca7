"""Published images: pull the release pipeline's image of a row instead of building it, and say what a build costs.

The registry is a setting: `TRAINKIT_REGISTRY` (default ghcr.io/trainkit, where .github/workflows/release.yml
pushes; empty: never pull, always build). A pulled image is checked against images/versions.toml by its labels
(registry.pull) before it is tagged as the local image the run asked for.
"""

from __future__ import annotations

import os
import re

import docker
import registry
from errors import UserError
from matrix import REPOSITORY, Matrix, cpu_tags, cuda_tags

REGISTRY_ENV = "TRAINKIT_REGISTRY"
DEFAULT_REGISTRY = "ghcr.io/trainkit"
LOCAL_TAG = re.compile(rf"^{REPOSITORY}:(?:[\w.]+-)?(?:cpu|cu(?P<major>\d+)(?P<minor>\d)(?:-ngc[\d.]+)?)$")


def configured_registry() -> str:
    return os.environ.get(REGISTRY_ENV, DEFAULT_REGISTRY).strip().rstrip("/")


def published_ref(image: str, matrix: Matrix, where: str) -> str | None:
    """The published immutable tag of local `image`: trainkit:latest-cu128 -> R/trainkit:0.1.0-cu128-ngc25.03."""
    match = LOCAL_TAG.match(image)
    if not match or not where:
        return None
    if match["major"] is None:
        return cpu_tags(matrix, where)[0]
    entry = matrix.entries.get(f"{match['major']}.{match['minor']}")
    return cuda_tags(matrix, entry, registry=where)[0] if entry else None


def pull_published(client: docker.DockerClient, image: str, matrix: Matrix, log) -> bool:
    """Pull the published image of `image` and tag it as `image`; False (and why, logged) when there is none."""
    ref = published_ref(image, matrix, configured_registry())
    if ref is None:
        return False
    log(f"looking for a published image: {ref} ({REGISTRY_ENV}; empty: always build)")
    try:
        pulled = registry.pull(client, ref, matrix)
    except UserError as exc:
        log(f"no published image used: {str(exc).splitlines()[0]}")
        return False
    repository, _, tag = image.rpartition(":")
    pulled.tag(repository, tag)
    log(f"pulled {ref} ({pulled.id[:19]}), labels match images/versions.toml; tagged {image}")
    return True


def first_build_note(image: str, matrix: Matrix) -> str:
    """What the first build of `image` downloads, compiles and takes; estimates, said before it starts."""
    match = LOCAL_TAG.match(image)
    if match and match["major"] is None:
        return (
            "first build of the CPU flavor: a Debian base with CPU torch (1.5 GB), then DeepSpeed's CPU ops "
            "compiled; about 10-15 minutes on 2 cores, a 2.35 GB image (measured on a 2-core x86_64 machine)"
        )
    entry = matrix.entries.get(f"{match['major']}.{match['minor']}") if match else None
    if entry is None:
        return "first build: see docs/images.md for what it downloads and compiles"
    return (
        f"first build of CUDA {entry.cuda}: pulls NGC {entry.ngc} (about 10 GB download, 20 GB on disk) and "
        "compiles DeepSpeed's ops for every GPU generation of the row; expect 30-60 minutes and 30 GB of disk "
        "(an estimate: the stand-in build of this Dockerfile takes 15-30 minutes on 2 cores, docs/images.md)"
    )
