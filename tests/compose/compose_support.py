"""Shared helpers for the end-to-end tests of docker-compose.yml, the entrypoint, doctor and scripts/run.py.

Every test gets its own project folder (data/, output/, .env) and compose project name, runs the
CPU image as UID 1234 (not root, to prove outputs belong to the invoking user) and cleans up its
containers and cache volume.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import docker

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILES = ["-f", str(ROOT / "docker-compose.yml"), "-f", str(ROOT / "docker-compose.cpu.yml")]
RUN_PY = ROOT / "scripts" / "run.py"
UID = GID = 1234
SECRET = "hf_trainkitTestSecret0123456789"
# Few, fast steps: the tiny preset on 64-token sequences, one process, the default DataLoader workers.
TINY_SETTINGS = {
    "TRAIN_MODEL": "tiny",
    "TRAIN_SEQ_LEN": "64",
    "TRAIN_BATCH_SIZE": "2",
    "TRAIN_LOG_STEPS": "1",
    "TRAIN_SAVE_TOTAL_LIMIT": "20",
}
CORPUS_LINE = "The quick brown fox jumps over the lazy dog while the trainer counts its steps. "


FALLBACK_MEMLOCK = 8 * 1024 * 1024  # Linux's default memlock limit since 5.11


def memlock_for(docker_client, image: str) -> int:
    """The memlock limit `image`'s containers may get on this engine: -1 where it may raise the limit, else 8 MiB.

    An engine started with a capped memlock limit and without CAP_SYS_RESOURCE (rootless Docker, some
    sandboxes) refuses -1 with "error setting rlimit type 8"; TRAINKIT_MEMLOCK / --memlock exist for it.
    """
    from docker.errors import APIError
    from docker.types import Ulimit

    container = docker_client.containers.create(
        image, ["shell", "-c", "true"], ulimits=[Ulimit(name="memlock", soft=-1, hard=-1)]
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


def write_dataset(folder: Path, lines: int = 400) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    text = "\n".join(f"{i}: {CORPUS_LINE * (1 + i % 3)}" for i in range(lines))
    (folder / "corpus.txt").write_text(text + "\n")


def write_env(path: Path, values: dict[str, str]) -> None:
    path.write_text("".join(f"{key}={value}\n" for key, value in values.items()))


def owned_output(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    os.chown(folder, UID, GID)
    return folder


def complete_checkpoints(output: Path) -> list[int]:
    """Steps of the checkpoints that finished writing (marker present), ascending."""
    steps = []
    for entry in output.glob("checkpoint-*"):
        match = re.fullmatch(r"checkpoint-(\d+)", entry.name)
        if match and (entry / "trainkit_complete").exists():
            steps.append(int(match[1]))
    return sorted(steps)


def global_step(checkpoint: Path) -> int:
    return int(json.loads((checkpoint / "trainer_state.json").read_text())["global_step"])


def files_under(folder: Path) -> list[Path]:
    return [folder, *folder.rglob("*")]


def assert_owned_by_user(folder: Path) -> None:
    owners = {path: (path.stat().st_uid, path.stat().st_gid) for path in files_under(folder)}
    wrong = [f"{path} {owner}" for path, owner in owners.items() if owner != (UID, GID)]
    assert not wrong, f"not owned by {UID}:{GID}: {wrong[:5]}"


def assert_secret_absent(*texts: str) -> None:
    for text in texts:
        assert SECRET not in text


def secret_free_outputs(output: Path) -> None:
    """run_config.json and every trainer_state.json must not hold the token."""
    files = [output / "run_config.json", *output.rglob("trainer_state.json")]
    assert (output / "run_config.json").exists()
    for file in files:
        assert SECRET not in file.read_text(errors="replace"), f"HF_TOKEN found in {file}"


class Compose:
    """`docker compose` on the repository's files with a test's own project folder and name."""

    def __init__(self, folder: Path, name: str) -> None:
        self.folder = folder
        self.name = name

    def command(self, *args: str) -> list[str]:
        return ["docker", "compose", "-p", self.name, "--project-directory", str(self.folder), *COMPOSE_FILES, *args]

    def run(self, *args: str, timeout: float = 600, env: dict[str, str] | None = None, check: bool = True):
        result = subprocess.run(
            self.command(*args),
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
            check=False,
        )
        # Some compose/engine pairs exit 0 although the daemon refused to start the container.
        if check and (result.returncode != 0 or "Error response from daemon" in result.stderr):
            raise AssertionError(f"{' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result

    def run_once(self, service: str, *command: str, options: tuple[str, ...] = (), timeout: float = 300):
        """`docker compose run` -> (exit code, stdout, stderr). The code is read from the container: some
        compose/engine pairs (compose 2.40 on engine 20.10) make `compose run` itself exit 0 regardless."""
        name = f"{self.name}-once-{time.monotonic_ns()}"
        result = self.run("run", "-T", "--name", name, *options, service, *command, timeout=timeout, check=False)
        container = docker.from_env().containers.get(name)
        try:
            return int(container.attrs["State"]["ExitCode"]), result.stdout, result.stderr
        finally:
            container.remove(force=True)

    def logs(self, service: str = "train") -> str:
        result = self.run("logs", "--no-color", "--no-log-prefix", service, check=False)
        return result.stdout + result.stderr

    def container(self, service: str = "train"):
        client = docker.from_env()
        found = client.containers.list(
            all=True,
            filters={"label": [f"com.docker.compose.project={self.name}", f"com.docker.compose.service={service}"]},
        )
        assert found, f"no container for service {service}"
        return found[0]

    def state(self, service: str = "train") -> dict:
        container = self.container(service)
        container.reload()
        return {**container.attrs["State"], "RestartCount": container.attrs["RestartCount"]}
