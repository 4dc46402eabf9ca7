"""The .env of a cluster job: plain settings (copied into the job file) and secrets (never copied into it), parsed
with the one .env parser (trainer.envfile) and checked by the trainer's own TRAIN_* validation.

Its own module so that cluster.py, cluster_slurm.py and cluster_k8s.py all import it and none imports another back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from errors import UserError, exit_missing_package

try:
    from trainer.config import parse_settings
    from trainer.envfile import EnvFileError, read_env_file
    from trainer.errors import ConfigError
    from trainer.secrets import is_secret_name
except ModuleNotFoundError as missing:
    exit_missing_package(missing)


@dataclass
class EnvFile:
    """A parsed .env: plain settings (copied into the job) and secrets (never copied into it)."""

    path: Path | None
    settings: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)


def read_env(path: Path | None) -> EnvFile:
    """Parse the user's .env with the one parser; TRAIN_* are checked by the trainer's own validation (the .env's
    values only, never this machine's environment), so a mistake fails here, not on the cluster."""
    env = EnvFile(path=path.resolve() if path else None)
    if path is None:
        return env
    if not path.is_file():
        raise UserError(f"--env-file {path}: no such file (copy .env.example to .env, or leave --env-file out).")
    try:
        values = read_env_file(path)
    except EnvFileError as exc:
        raise UserError(str(exc)) from None
    for name, value in values.items():
        (env.secrets if is_secret_name(name) else env.settings)[name] = value
    try:
        parse_settings(env.settings)
    except ConfigError as exc:
        raise UserError(f"{path}: {exc.message}") from None
    return env
