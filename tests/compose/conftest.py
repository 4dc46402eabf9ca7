"""Fixtures for tests/compose: a user's project folder per test, cleaned up afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from compose_support import GID, TINY_SETTINGS, UID, Compose, memlock_for, owned_output, write_dataset, write_env


@pytest.fixture(scope="session")
def engine_memlock(docker_client, cpu_image) -> int:
    """-1 (unlimited, what compose and run.py ask for) where the engine may raise the limit; else 8 MiB."""
    return memlock_for(docker_client, cpu_image)


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
