"""HF_TOKEN_PATH (issue 26, item 13): the Hub token as a mounted file, the documented way that keeps it out of
`docker inspect`. Real `python -m trainer` runs against the stand-in Hub, which checks the bearer token."""

from __future__ import annotations

from pathlib import Path

from hub_support import GATED_ID, TOKEN, online, run_config, run_env


def token_file(folder: Path, token: str) -> Path:
    path = folder / "hf_token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


def test_a_token_file_reads_a_gated_model_and_is_stored_nowhere(run_trainer, tmp_path: Path, hub) -> None:
    env = online(run_env(tmp_path, model=GATED_ID), hub)
    env.pop("HF_TOKEN", None)
    missing = run_trainer(["train"], env={**env, "HF_TOKEN_PATH": str(tmp_path / "absent")})
    assert missing.returncode == 2, missing.stderr
    assert f"HF_TOKEN_PATH={tmp_path / 'absent'}: no such file" in missing.stderr
    assert "Traceback" not in missing.stderr
    expired = token_file(tmp_path, "hf_expiredTokenThatTheHubRefuses1")
    refused = run_trainer(["train"], env={**env, "HF_TOKEN_PATH": str(expired)})
    assert refused.returncode == 2, refused.stderr
    assert "unauthorized (401)" in refused.stderr and f"read from HF_TOKEN_PATH={expired}" in refused.stderr
    result = run_trainer(["train"], env={**env, "HF_TOKEN_PATH": str(token_file(tmp_path, TOKEN))})
    assert result.returncode == 0, result.stderr[-4000:]
    out = tmp_path / "output"
    assert run_config(out)["hub"]["model"]["repo_id"] == GATED_ID
    assert not [p for p in out.rglob("*") if p.is_file() and TOKEN.encode() in p.read_bytes()]
    assert TOKEN not in result.stderr + result.stdout
