"""Fixtures for tests/compose: a user's project folder per test, cleaned up afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from compose_support import GID, TINY_SETTINGS, UID, Compose, owned_output, write_dataset, write_env
from docker.errors import APIError

FALLBACK_MEMLOCK = 8 * 1024 * 1024  # Linux's default memlock limit since 5.11


@pytest.fixture(scope="session")
def engine_memlock(docker_client, cpu_image) -> int:
    """-1 (unlimited, what compose and run.py ask for) where the engine may raise the limit; else 8 MiB.

    An engine started with a capped memlock limit and without CAP_SYS_RESOURCE (rootless Docker, some
    sandboxes) refuses -1 with "error setting rlimit type 8"; TRAINKIT_MEMLOCK / --memlock exist for it.
    """
    from docker.types import Ulimit

    container = docker_client.containers.create(
        cpu_image, ["shell", "-c", "true"], ulimits=[Ulimit(name="memlock", soft=-1, hard=-1)]
    )
    try:
        container.start()
        container.wait()
    except APIError as exc:
        if "rlimit type 8" not in str(exc):
            raise
        return FALLBACK_MEMLOCK
    finally:
        container.remove(force=True)
    return -1


@pytest.fixture
def project(tmp_path: Path, cpu_image: str, engine_memlock: int) -> Iterator[tuple[Compose, Path]]:
    """A user's project folder: data/ with a small corpus, output/ owned by UID 1234, .env."""
    folder = tmp_path / "project"
    write_dataset(folder / "data")
    owned_output(folder / "output")
    name = f"tk{uuid.uuid4().hex[:10]}"
    base_env = {
        "TRAINKIT_UID": str(UID),
        "TRAINKIT_GID": str(GID),
        "TRAINKIT_CPU_IMAGE": cpu_image,
        "TRAINKIT_CACHE_VOLUME": f"{name}-cache",
        "TRAINKIT_STOP_GRACE_PERIOD": "60s",
        "TRAINKIT_MEMLOCK": str(engine_memlock),
        **TINY_SETTINGS,
    }
    write_env(folder / ".env", base_env)
    compose = Compose(folder, name)
    yield compose, folder
    compose.run("down", "--volumes", "--remove-orphans", "--timeout", "5", check=False, timeout=120)
