"""The Hub token as a file for run.py (`--hf-token-file`): mounted read-only and named by HF_TOKEN_PATH, which
huggingface_hub reads, so the token is not in the container's environment and `docker inspect` does not show it."""

from __future__ import annotations

from pathlib import Path

from errors import UserError

TARGET = "/run/secrets/hf_token"  # where compose mounts its `hf_token` secret too


def add_token_file(path: str | None, env: dict[str, str], volumes: dict[str, dict[str, str]]) -> None:
    """Mount `path` at TARGET and point HF_TOKEN_PATH at it; HF_TOKEN from this environment is then not passed."""
    if not path:
        return
    host = Path(path).expanduser().resolve()
    if not host.is_file():
        raise UserError(f"--hf-token-file {path}: no such file ({host}); write your token there (one line)")
    volumes[str(host)] = {"bind": TARGET, "mode": "ro"}
    env["HF_TOKEN_PATH"] = TARGET
    env.pop("HF_TOKEN", None)
