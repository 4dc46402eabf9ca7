"""Fixtures of the image tests: a real registry on 127.0.0.1 (Debian's `docker-registry`, the CNCF distribution
registry), shared by the push/pull tests and the CPU base's registry path."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest


def inside_an_image(folder: Path, monkeypatch: pytest.MonkeyPatch, piece: str, reason: str, row: str) -> None:
    """The trainer's view from inside an image of row `row` whose build skipped `piece` for `reason`: its build
    manifest and build.json (trainer/provenance.py's MANIFEST_FILE and BUILD_FILE) written in `folder`."""
    from trainer import provenance

    manifest, build = folder / "build-manifest.json", folder / "build.json"
    manifest.write_text(json.dumps({"extensions": {piece: {"status": "skipped", "reason": reason}}}))
    build.write_text(json.dumps({"org.trainkit.row": row}))
    monkeypatch.setattr(provenance, "MANIFEST_FILE", manifest)
    monkeypatch.setattr(provenance, "BUILD_FILE", build)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def registry(tmp_path_factory, docker_client) -> str:
    """A real registry on 127.0.0.1:<port> (the engine treats loopback registries as insecure-allowed)."""
    binary = shutil.which("docker-registry")
    if binary is None:
        pytest.fail("docker-registry is missing: tests/run.sh installs Debian's docker-registry package")
    folder = tmp_path_factory.mktemp("registry")
    port = free_port()
    config = folder / "config.yml"
    config.write_text(f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {folder}/data\n"
                      f"  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n")  # fmt: skip
    with (folder / "registry.log").open("wb") as log:
        proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2)
                break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("the local registry did not answer: " + (folder / "registry.log").read_text()[-2000:])
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for image in docker_client.images.list(name=f"127.0.0.1:{port}/trainkit"):  # this run's tags only
            for tag in image.tags:
                if tag.startswith(f"127.0.0.1:{port}/"):
                    docker_client.images.remove(tag, noprune=True)
