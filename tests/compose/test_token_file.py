"""The Hub token as a mounted file (issue 26, item 13): `run.py --hf-token-file` and compose's `hf_token` secret
(TRAINKIT_HF_TOKEN_FILE) mount it read-only and set HF_TOKEN_PATH, so the token is in no container's environment
and so not in `docker inspect` (whose Config.Env is that environment); huggingface_hub reads it from the file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from compose_support import GID, SECRET, UID
from test_run_py import base_args, run_project, run_py  # noqa: F401  (run_project: the fixture)

# What the container sees: the token huggingface_hub finds, and whether any environment value holds it.
PROBE = (
    "import os, huggingface_hub; t = huggingface_hub.get_token(); "
    "print('token-found', t == os.environ['EXPECTED'], 'in-env', any(t in v for k, v in os.environ.items() "
    "if k != 'EXPECTED'), os.environ.get('HF_TOKEN_PATH'))"
)


def token_file(folder: Path) -> Path:
    path = folder / "hf_token"
    path.write_text(SECRET + "\n")
    os.chown(path, UID, GID)  # the user's own file, readable by them only
    path.chmod(0o600)
    return path


@pytest.mark.docker
def test_run_py_mounts_the_token_file(run_project, cpu_image, engine_memlock):  # noqa: F811
    path = token_file(run_project)
    args = [*base_args(cpu_image, engine_memlock), "--hf-token-file", str(path), "-e", f"EXPECTED={SECRET}"]
    result = run_py(*args, "--", "python", "-c", PROBE, cwd=run_project, env={"HF_TOKEN": SECRET})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "token-found True in-env False /run/secrets/hf_token" in result.stdout
    missing = run_py(*base_args(cpu_image, engine_memlock), "--hf-token-file", "nope", "train", cwd=run_project)
    assert missing.returncode == 2 and "--hf-token-file nope: no such file" in missing.stderr


@pytest.mark.docker
def test_compose_mounts_the_token_file_as_a_secret(project):
    compose, folder = project
    path = token_file(folder)
    with (folder / ".env").open("a") as env_file:  # compose reads its own variables from the project's .env
        env_file.write(f"TRAINKIT_HF_TOKEN_FILE={path}\n")
    code, out, err = compose.run_once("train", "python", "-c", PROBE, options=("-e", f"EXPECTED={SECRET}"))
    assert code == 0, out + err
    assert "token-found True in-env False /run/secrets/hf_token" in out
