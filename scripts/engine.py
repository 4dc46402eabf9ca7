"""Connecting to the Docker Engine from host scripts, with messages a user can act on."""

from __future__ import annotations

import sys

import docker
from docker.errors import DockerException


class UserError(Exception):
    """A mistake the user can fix; scripts print it without a traceback and exit 2."""


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


def exit_missing_package(exc: ModuleNotFoundError) -> None:
    """For a script's imports of this project's own torch-free modules (trainer.envfile, trainer.secrets...)."""
    print(
        f"error: cannot import {exc.name!r}: install the host tools from the repository with "
        "`pip install -e '.[host]'` (scripts/quickstart.sh does), then retry.",
        file=sys.stderr,
    )
    sys.exit(2)


def torch_version_in(image: str) -> str:
    """torch.__version__ as `image` reports it (NGC's carries a suffix such as ".nv25.03")."""
    try:
        out = connect().containers.run(image, ["-c", "import torch; print(torch.__version__)"], entrypoint="python",
                                       remove=True, stdout=True, stderr=False)  # fmt: skip
    except docker.errors.ContainerError as exc:
        why = (exc.stderr or b"").decode(errors="replace").strip().splitlines()[-1:] or [str(exc)]
        raise UserError(f"{image} has no importable torch (a trainkit base needs one): {why[0]}") from None
    return out.decode().strip().splitlines()[-1]


def key_values(items: list[str], option: str) -> dict[str, str]:
    """['K=V', ...] given with `option` -> {K: V}; a UserError naming the item that is not KEY=VALUE."""
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"{option} {item!r}: use KEY=VALUE.")
        pairs[key] = value
    return pairs


def exit_on_user_error(main):
    """Decorator for script entry points: UserError -> message on stderr, exit 2."""

    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)

    wrapper.__name__ = main.__name__
    wrapper.__doc__ = main.__doc__
    return wrapper
