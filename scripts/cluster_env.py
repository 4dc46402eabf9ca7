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
    from trainer.secrets import holds_secret, mask_value
    from trainer.transformers_names import check_train_args, split_train_args
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
    for name, value in values.items():  # the one secret rule: by name (HF_TOKEN) or by value (HF_ENDPOINT's password)
        (env.secrets if holds_secret(name, value) else env.settings)[name] = value
    try:
        settings = parse_settings({**env.settings, **env.secrets})
        problems = check_train_args(split_train_args(settings.args))  # a token in TRAIN_ARGS fails here, not later
    except ConfigError as exc:
        problems = exc.problems
    if problems:  # values never shown: a secret may be among them
        raise UserError(f"{path}: {ConfigError(*(mask_value(p) for p in problems)).message}")
    return env
