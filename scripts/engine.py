"""Connecting to the Docker Engine from host scripts, with messages a user can act on."""

from __future__ import annotations

import docker
from docker.errors import DockerException
from errors import UserError


def connect() -> docker.DockerClient:
    """A client for the local engine (DOCKER_HOST honoured), or a UserError saying how to start one."""
    try:
        client = docker.from_env()
        client.ping()
    except DockerException as exc:
        raise UserError(
            "cannot reach the Docker Engine "
            f"({exc.__class__.__name__}: {str(exc).splitlines()[0][:200]}).\n"
            "  Start it (e.g. `sudo systemctl start docker`, or `dockerd &`), check DOCKER_HOST, "
            "and make sure your user may use it (`docker info` must work)."
        ) from None
    return client


def torch_version_in(image: str) -> str:
    """torch.__version__ as `image` reports it (NGC's carries a suffix such as ".nv25.03")."""
    try:
        out = connect().containers.run(image, ["-c", "import torch; print(torch.__version__)"], entrypoint="python",
                                       remove=True, stdout=True, stderr=False)  # fmt: skip
    except docker.errors.ContainerError as exc:
        why = (exc.stderr or b"").decode(errors="replace").strip().splitlines()[-1:] or [str(exc)]
        raise UserError(f"{image} has no importable torch (a trainkit base needs one): {why[0]}") from None
    return out.decode().strip().splitlines()[-1]
