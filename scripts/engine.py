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

