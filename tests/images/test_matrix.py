"""versions.toml, matrix.py and build.py's plan: no Docker engine needed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "scripts" / "build.py"
VERSIONS = tomllib.loads((ROOT / "images" / "versions.toml").read_text())
CUDAS = list(VERSIONS["cuda"])

sys.path.insert(0, str(ROOT / "scripts"))
import matrix  # noqa: E402


def build_py(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BUILD), *args], capture_output=True, text=True, timeout=60,
                          env=env, cwd=ROOT)  # fmt: skip


@pytest.mark.parametrize("cuda", CUDAS)
def test_dry_run_prints_the_resolved_plan(cuda: str) -> None:
    entry = VERSIONS["cuda"][cuda]
    # No engine at all: DOCKER_HOST points nowhere, the dry run must not care.
    proc = build_py("--cuda", cuda, "--dry-run", env={**os.environ, "DOCKER_HOST": "tcp://127.0.0.1:9"})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    xy = cuda.replace(".", "")
    assert f"nvcr.io/nvidia/pytorch:{entry['ngc']}-py3" in out
    assert f"torch:   {entry['torch']}" in out
    assert f"python:  {entry['python']}" in out
    assert entry["arch_list"] in out
    assert f"trainkit:{VERSIONS['version']}-cu{xy}-ngc{entry['ngc']}" in out
    assert f"trainkit:latest-cu{xy}" in out
    pins = {**VERSIONS["packages"], **entry.get("packages", {})}
    for package, version in pins.items():
        assert f"{package}=={version}" in out


def test_cuda_12_1_resolves_to_an_ngc_23_release() -> None:
    proc = build_py("--cuda", "12.1", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"nvcr\.io/nvidia/pytorch:23\.\d\d-py3", proc.stdout)


def test_all_dry_run_covers_the_matrix() -> None:
    proc = build_py("--all", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("plan: trainkit") == len(CUDAS)


def test_unknown_cuda_exits_2_listing_the_supported_ones() -> None:
    proc = build_py("--cuda", "11.8", "--dry-run")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "11.8" in proc.stderr
    for cuda in CUDAS:
        assert cuda in proc.stderr


def test_bad_ngc_and_ca_cert_are_user_errors(tmp_path: Path) -> None:
    proc = build_py("--cuda", "12.8", "--ngc", "2503", "--dry-run")
    assert proc.returncode == 2 and "YY.MM" in proc.stderr and "Traceback" not in proc.stderr
    not_pem = tmp_path / "ca.txt"
    not_pem.write_text("hello")
    env = {**os.environ, "DOCKER_HOST": "tcp://127.0.0.1:9", "TRAINKIT_CA_CERT": str(not_pem)}
    proc = build_py("--cpu", env=env)
    assert proc.returncode == 2 and "TRAINKIT_CA_CERT" in proc.stderr and "Traceback" not in proc.stderr


def test_unreachable_engine_is_one_clear_message() -> None:
    proc = build_py("--cpu", env={**os.environ, "DOCKER_HOST": "tcp://127.0.0.1:9"})
    assert proc.returncode == 2
    assert "cannot reach the Docker Engine" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_ngc_override_keeps_the_entry_pins_and_names_the_base_in_the_tag() -> None:
    proc = build_py("--cuda", "12.8", "--ngc", "25.02", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "nvcr.io/nvidia/pytorch:25.02-py3" in proc.stdout
    assert "trainkit:0.1.0-cu128-ngc25.02" in proc.stdout
    assert "not in the matrix" in proc.stdout


def test_tags_and_default_images() -> None:
    m = matrix.load()
    assert matrix.cpu_tags(m) == [f"trainkit:{m.version}-cpu", "trainkit:latest-cpu"]
    assert matrix.cpu_tags(m, "reg.example/me")[0] == f"reg.example/me/trainkit:{m.version}-cpu"
    assert matrix.default_image(gpu=False) == "trainkit:latest-cpu"
    assert matrix.default_image(gpu=True) == f"trainkit:latest-cu{m.default_cuda.replace('.', '')}"
    assert m.default_cuda in m.entries


def test_every_entry_is_complete() -> None:
    for cuda, entry in VERSIONS["cuda"].items():
        assert re.fullmatch(r"\d\d\.\d\d", entry["ngc"]), cuda
        assert entry["cuda_full"].startswith(cuda + "."), cuda
        assert {"apex", "flash_attn", "transformer_engine"} <= set(entry["includes"]), cuda
        for key in ("torch", "python", "ubuntu", "driver_min", "arch_list"):
            assert entry[key], (cuda, key)


def test_images_doc_shows_the_matrix_table() -> None:
    # The drift check over every generated file (this one included) is tests/test_generated.py's.
    assert matrix.readme_table() in (ROOT / "docs" / "images.md").read_text()


def test_hadolint_passes_on_the_dockerfiles() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    for dockerfile in (ROOT / "Dockerfile", ROOT / "images" / "cpu-base" / "Dockerfile"):
        proc = subprocess.run([str(hadolint), str(dockerfile)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{dockerfile}:\n{proc.stdout}{proc.stderr}"


def test_with_ca_exposes_the_extra_ca_only_while_the_command_runs(tmp_path: Path) -> None:
    extra = tmp_path / "ca.pem"
    extra.write_text("-----BEGIN CERTIFICATE-----\nTRAINKITMARKER\n-----END CERTIFICATE-----\n")
    script = "cat \"$PIP_CERT\"; test \"$PIP_CERT\" = \"$REQUESTS_CA_BUNDLE\"; echo \"$PIP_CERT\" > " + str(
        tmp_path / "where"
    )
    proc = subprocess.run(["sh", str(ROOT / "images" / "with-ca.sh"), "sh", "-c", script], capture_output=True,
                          text=True, env={**os.environ, "CA_SECRET_FILE": str(extra)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "TRAINKITMARKER" in proc.stdout
    bundle = Path((tmp_path / "where").read_text().strip())
    assert not bundle.exists(), "the combined bundle outlived the command"
    failing = subprocess.run(["sh", str(ROOT / "images" / "with-ca.sh"), "sh", "-c", "exit 7"],
                             env={**os.environ, "CA_SECRET_FILE": str(extra)})  # fmt: skip
    assert failing.returncode == 7
