"""The CPU base's two paths: FROM a registry's Debian where one answers (here the local registry on 127.0.0.1 serving
a Debian image made from the debootstrap root filesystem, pinned by digest), else the debootstrap root filesystem.

Only the base stage is built from the registry path (Python, the CPU torch and its constraint, the labels): the
image layers on top are the same Dockerfile either way, and a second cold image build (DeepSpeed's CPU ops) would
cost CI 10-15 minutes."""

from __future__ import annotations

import dataclasses
import io
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
STALE_BASE = "trainkit-base:test-older-recipe"
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


def test_a_base_made_by_another_recipe_is_remade(docker_client, cpu_image: str, capsys) -> None:
    """An engine kept between runs (CI machines, a laptop after `git pull`) holds a base an older checkout made, under
    the same tag: it is remade, saying why, and the remade base carries today's recipe and origin labels; a base made
    by today's recipe is kept."""
    cpu = load().cpu
    older = f"FROM {cpu.base_image}\nLABEL {cpu_base.RECIPE_LABEL}=older {cpu_base.BASE_FROM_LABEL}=\n"
    docker_client.images.build(fileobj=io.BytesIO(older.encode()), tag=STALE_BASE, rm=True)
    try:
        ca = host_ca_bundle()
        cpu_base.ensure_cpu_base(docker_client, cpu, ca, lambda _line: None, tag=STALE_BASE)
        err = capsys.readouterr().err
        assert f"CPU base {STALE_BASE}: remade (made by another recipe (older, today's is " in err
        labels = docker_client.images.get(STALE_BASE).labels
        assert labels[cpu_base.RECIPE_LABEL] == cpu_base.recipe_digest(cpu)
        made_from = labels[cpu_base.BASE_FROM_LABEL]  # the registry's Debian or, where none answers, debootstrap's
        assert made_from in (cpu_base.debian_image(cpu), cpu_base.rootfs_tag(cpu))
        assert f"CPU base: FROM {made_from}" in err
        cpu_base.ensure_cpu_base(docker_client, cpu, ca, lambda _line: None, tag=STALE_BASE)
        assert "CPU base" not in capsys.readouterr().err
    finally:
        if cpu_base.image_exists(docker_client, STALE_BASE):
            docker_client.images.remove(STALE_BASE, noprune=True)
