"""The CPU base's two paths: FROM a registry's Debian where one answers (here the local registry on 127.0.0.1 serving
a Debian image made from the debootstrap root filesystem, pinned by digest), else the debootstrap root filesystem.

Only the base stage is built from the registry path (Python, the CPU torch and its constraint, the labels): the
image layers on top are the same Dockerfile either way, and a second cold image build (DeepSpeed's CPU ops) would
cost CI 10-15 minutes."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import cpu_base  # noqa: E402
from build import host_ca_bundle  # noqa: E402
from errors import UserError  # noqa: E402
from matrix import load  # noqa: E402

TEST_BASE = "trainkit-base:test-registry-path"  # never the shared base tag: the CPU image must not rebuild
UNREACHABLE = "127.0.0.1:9/debian@sha256:" + "0" * 64  # nothing listens on port 9


@pytest.fixture(scope="module")
def debian_ref(registry: str, cpu_image: str, docker_client) -> Iterator[str]:
    """The session's debootstrap Debian pushed to the local registry; its repo@sha256 reference, not local. (Made here
    when the session's CPU base came from a registry, so no debootstrap root filesystem was made.)"""
    cpu = load().cpu
    if not cpu_base.image_exists(docker_client, cpu_base.rootfs_tag(cpu)):
        cpu_base.build_rootfs(docker_client, cpu, lambda _line: None)
    rootfs = docker_client.images.get(cpu_base.rootfs_tag(cpu))
    rootfs.tag(f"{registry}/debian", "bookworm-slim")
    digest = None
    for event in docker_client.images.push(f"{registry}/debian", "bookworm-slim", stream=True, decode=True):
        assert "error" not in event, event
        digest = (event.get("aux") or {}).get("Digest") or digest
    assert digest, "the registry confirmed no digest"
    ref = f"{registry}/debian@{digest}"
    docker_client.images.remove(f"{registry}/debian:bookworm-slim", noprune=True)
    assert not cpu_base.image_exists(docker_client, ref)  # the build must pull it from the registry
    yield ref
    if cpu_base.image_exists(docker_client, ref):
        docker_client.images.remove(ref, noprune=True)


def test_the_base_builds_from_a_registry_debian_when_one_answers(debian_ref: str, docker_client, monkeypatch,
                                                                capsys) -> None:  # fmt: skip
    monkeypatch.setenv(cpu_base.DEBIAN_IMAGE_ENV, debian_ref)
    cpu = load().cpu
    try:
        ca = host_ca_bundle()  # as build.py does: the host's CA bundle (a TLS-inspecting proxy's CA)
        tag = cpu_base.ensure_cpu_base(docker_client, cpu, ca, lambda _line: None, tag=TEST_BASE)
        assert f"CPU base: FROM {debian_ref} (a registry answered)" in capsys.readouterr().err
        labels = docker_client.images.get(tag).labels
        assert labels["org.trainkit.base.from"] == debian_ref
        assert labels["org.trainkit.base.torch"] == cpu.torch and labels["org.trainkit.base.debian"] == "bookworm"
        out = docker_client.containers.run(tag, ["sh", "-c", "python -c 'import torch, sys; print(torch.__version__, "
                                           "sys.version_info[:2])'; cat /etc/pip/constraint.txt; g++ --version"],
                                           remove=True).decode()  # fmt: skip
        assert f"{cpu.torch}+cpu (3, 11)" in out and f"torch=={cpu.torch}+cpu" in out and "g++" in out
    finally:
        if cpu_base.image_exists(docker_client, TEST_BASE):
            docker_client.images.remove(TEST_BASE, noprune=True)


def test_without_a_registry_the_base_falls_back_to_debootstrap(docker_client, cpu_image: str, monkeypatch) -> None:
    """Nothing listens on 127.0.0.1:9: the debootstrap root filesystem is used (the session's CPU image was built
    that way, where no registry answers), and the path says why."""
    monkeypatch.setenv(cpu_base.DEBIAN_IMAGE_ENV, UNREACHABLE)
    root, path = cpu_base.root_image(docker_client, load().cpu, lambda _line: None)
    assert root == cpu_base.rootfs_tag(load().cpu)
    assert path.startswith(f"FROM {root}, a Debian root filesystem made by debootstrap (no registry answered for "
                           f"{UNREACHABLE}")  # fmt: skip


@pytest.mark.skipif(os.geteuid() != 0, reason="as non-root the fallback stops earlier, at 'needs root'")
def test_with_neither_a_registry_nor_debootstrap_it_says_what_to_install(docker_client, monkeypatch) -> None:
    """A machine without debootstrap (Debian keeps it in /usr/sbin: off this PATH) and no registry: the error names
    both ways out, and no Debian root filesystem of that suite is made."""
    monkeypatch.setenv(cpu_base.DEBIAN_IMAGE_ENV, UNREACHABLE)
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")
    cpu = dataclasses.replace(load().cpu, debian_suite="trainkit-test-no-rootfs")  # no root filesystem made yet
    with pytest.raises(UserError) as raised:
        cpu_base.root_image(docker_client, cpu, lambda _line: None)
    message = str(raised.value)
    assert f"no registry answered for {UNREACHABLE}" in message
    assert "debootstrap is missing (not on PATH)" in message and "sudo apt-get install debootstrap" in message
    assert f"{cpu_base.DEBIAN_IMAGE_ENV}=host/debian:" in message
    assert not cpu_base.image_exists(docker_client, cpu_base.rootfs_tag(cpu))
