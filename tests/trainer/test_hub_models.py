"""TRAIN_MODEL=org/name[@revision]: downloaded through huggingface_hub (from the stand-in Hub, HF_ENDPOINT) or found
in a pre-populated cache with HF_HUB_OFFLINE=1; the commit is recorded and kept on resume; gated, missing and
unauthorized models exit 2 with a message naming the case. Real `python -m trainer train` runs."""

from __future__ import annotations

from pathlib import Path

from hub_server import populate_cache
from hub_support import GATED_ID, MODEL_ID, TOKEN, marker, online, run_config, run_env


def _ok(result) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-4000:]}"


def test_hub_id_trains_offline_from_a_populated_cache(run_trainer, tmp_path: Path, tiny_files) -> None:
    env = run_env(tmp_path, model=MODEL_ID)
    sha = "a" * 40
    populate_cache(Path(env["HF_HOME"]), MODEL_ID, tiny_files, sha)
    result = run_trainer(["train"], env={**env, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"})
    _ok(result)
    out = tmp_path / "output"
    recorded = run_config(out)["hub"]["model"]
    assert recorded == {"repo_id": MODEL_ID, "repo_type": "model", "revision": "main", "sha": sha}
    assert marker(out / "checkpoint-2")["hub"]["model"]["sha"] == sha
    assert marker(out / "final")["hub"]["model"]["sha"] == sha
    assert f"snapshots/{sha}" in run_config(out)["decisions"]["model"]["value"]
    assert (out / "final" / "model.safetensors").is_file()
    shown = run_trainer(["config"], env={**env, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"})
    assert shown.returncode == 0 and f"{MODEL_ID} │ main     │ {sha}" in shown.stdout, shown.stdout[-3000:]


def test_offline_without_the_model_in_the_cache_exits_2_naming_it(
    run_trainer, tmp_path: Path, imported_modules
) -> None:
    env = {**run_env(tmp_path, model=f"{MODEL_ID}@v1"), "HF_HUB_OFFLINE": "1"}
    result = run_trainer(["train"], env=env, python_args=["-X", "importtime"])
    assert result.returncode == 2, result.stderr
    modules = imported_modules(result.stderr)
    assert "huggingface_hub" in modules and "torch" not in modules, "the Hub is asked before torch is imported"
    assert f"TRAIN_MODEL={MODEL_ID}@v1" in result.stderr and "HF_HUB_OFFLINE=1" in result.stderr
    assert "python -m trainer fetch" in result.stderr and "Traceback" not in result.stderr


def test_download_records_the_commit_and_resume_keeps_it_after_the_branch_moved(
    run_trainer, tmp_path: Path, hub, tiny_files_v2
) -> None:
    env = online(run_env(tmp_path, model=MODEL_ID), hub)
    first = hub.repo(MODEL_ID).refs["main"]
    _ok(run_trainer(["train"], env=env))
    out = tmp_path / "output"
    assert run_config(out)["hub"]["model"]["sha"] == first
    assert any(r.startswith(f"GET /{MODEL_ID}/resolve/{first}/model.safetensors") for r in hub.requests)
    moved = hub.repo(MODEL_ID).commit(tiny_files_v2)  # main moves on
    result = run_trainer(["train"], env={**env, "TRAIN_MAX_STEPS": "4"})
    _ok(result)
    assert run_config(out)["hub"]["model"]["sha"] == first, "a resumed run keeps its checkpoint's commit"
    assert marker(out / "checkpoint-4")["hub"]["model"]["sha"] == first
    assert f"pinned by {out / 'checkpoint-2'}" in run_config(out)["decisions"]["model"]["reason"]
    fresh = tmp_path / "fresh"
    _ok(run_trainer(["train"], env={**env, "TRAIN_OUTPUT_DIR": str(fresh)}))
    assert run_config(fresh)["hub"]["model"]["sha"] == moved


def test_gated_model_exits_2_then_trains_with_the_token_which_is_stored_nowhere(
    run_trainer, tmp_path: Path, hub
) -> None:
    env = online(run_env(tmp_path, model=GATED_ID), hub)
    refused = run_trainer(["train"], env=env)
    assert refused.returncode == 2, refused.stderr
    assert "gated repository" in refused.stderr and "HF_TOKEN is not set" in refused.stderr
    assert f"{hub.url}/{GATED_ID}" in refused.stderr and "Traceback" not in refused.stderr
    result = run_trainer(["train"], env={**env, "HF_TOKEN": TOKEN})
    _ok(result)
    out = tmp_path / "output"
    written = [p for p in out.rglob("*") if p.is_file()]
    assert not [p for p in written if TOKEN.encode() in p.read_bytes()]
    assert TOKEN not in result.stderr + result.stdout
    assert run_config(out)["environment"]["HF_TOKEN"] == "***"


def test_missing_model_and_refused_token_exit_2_saying_which(run_trainer, tmp_path: Path, hub) -> None:
    env = online(run_env(tmp_path), hub)
    missing = run_trainer(["train"], env={**env, "TRAIN_MODEL": "org/no-such-model"})
    assert missing.returncode == 2, missing.stderr
    assert "TRAIN_MODEL=org/no-such-model: not found on the Hub" in missing.stderr
    revision = run_trainer(["train"], env={**env, "TRAIN_MODEL": f"{MODEL_ID}@no-such-branch"})
    assert revision.returncode == 2 and "has no revision 'no-such-branch'" in revision.stderr
    expired = "hf_expiredTokenThatTheHubRefuses1"
    refused = run_trainer(["train"], env={**env, "TRAIN_MODEL": GATED_ID, "HF_TOKEN": expired})
    assert refused.returncode == 2, refused.stderr
    assert "unauthorized (401)" in refused.stderr and "HF_TOKEN is set" in refused.stderr
    assert expired not in refused.stderr
    assert all("Traceback" not in r.stderr for r in (missing, revision, refused))


def test_two_workers_read_what_the_launcher_fetched(run_trainer, tmp_path: Path, hub) -> None:
    """torchrun workers get HF_HUB_OFFLINE=1 once the launcher has fetched the node's copy: one Hub lookup per node,
    the same commit on every rank."""
    env = {**online(run_env(tmp_path, model=MODEL_ID), hub), "TRAIN_NPROC_PER_NODE": "2"}
    result = run_trainer(["train"], env=env, module="trainer.launch", timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    lookups = [r for r in hub.requests if r.startswith(f"GET /api/models/{MODEL_ID}/revision/")]
    assert len(lookups) == 1, hub.requests
    assert run_config(tmp_path / "output")["hub"]["model"]["sha"] == hub.repo(MODEL_ID).refs["main"]
    assert run_config(tmp_path / "output")["environment"]["HF_HUB_OFFLINE"] == "1"


def test_credentials_in_hf_endpoint_are_masked(run_trainer, tmp_path: Path, hub) -> None:
    """A mirror given with credentials (HF_ENDPOINT=http://user:password@host) is masked in messages and
    run_config.json."""
    endpoint = hub.url.replace("http://", "http://mirror-user:s3cretPassw0rd@")
    env = {**online(run_env(tmp_path), hub), "HF_ENDPOINT": endpoint}
    missing = run_trainer(["train"], env={**env, "TRAIN_MODEL": "org/no-such-model"})
    assert missing.returncode == 2 and "not found on the Hub (http://***@127.0.0.1" in missing.stderr
    trained = run_trainer(["train"], env={**env, "TRAIN_MODEL": MODEL_ID})
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "s3cretPassw0rd" not in missing.stderr + trained.stderr + trained.stdout
    assert run_config(tmp_path / "output")["environment"]["HF_ENDPOINT"].startswith("http://***@127.0.0.1:")
    assert not [p for p in (tmp_path / "output").rglob("*") if p.is_file() and b"s3cretPassw0rd" in p.read_bytes()]
