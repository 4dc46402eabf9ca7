"""`python -m trainer fetch`: fills an empty cache from the (stand-in) Hub, after which an offline run trains without
asking the Hub anything; with HF_HUB_OFFLINE=1 it checks the cache instead of downloading."""

from __future__ import annotations

import json
from pathlib import Path

from hub_support import MODEL_ID, TOKEN, online, run_config, run_env


def test_fetch_fills_an_empty_cache_then_an_offline_run_trains(run_trainer, tmp_path: Path, hub) -> None:
    env = run_env(tmp_path, model=MODEL_ID)
    cache = Path(env["HF_HOME"]) / "hub"
    assert not cache.exists()
    fetched = run_trainer(["fetch"], env={**online(env, hub), "HF_TOKEN": TOKEN})
    assert fetched.returncode == 0, fetched.stderr
    assert TOKEN not in fetched.stdout + fetched.stderr
    stored = [p for p in Path(env["HOME"]).rglob("*") if p.is_file() and TOKEN.encode() in p.read_bytes()]
    assert stored == [], "HF_TOKEN is used, never stored"
    sha = hub.repo(MODEL_ID).refs["main"]
    assert f"fetched: TRAIN_MODEL={MODEL_ID}@main -> commit {sha}" in fetched.stdout
    assert f"cache: {cache}" in fetched.stdout and "HF_HUB_OFFLINE=1" in fetched.stdout
    assert f"TRAIN_MODEL={MODEL_ID}@{sha}" in fetched.stdout
    assert (cache / "models--org--tiny-llama" / "snapshots" / sha / "model.safetensors").is_file()

    asked = len(hub.requests)
    offline = {**env, "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "1"}  # the Hub is there, but must not be asked
    checked = run_trainer(["fetch", "--json"], env=offline)
    assert checked.returncode == 0, checked.stderr
    report = json.loads(checked.stdout)
    assert report["offline_check"] is True and report["fetched"]["TRAIN_MODEL"]["sha"] == sha
    trained = run_trainer(["train"], env=offline)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert run_config(tmp_path / "output")["hub"]["model"]["sha"] == sha
    assert len(hub.requests) == asked, hub.requests[asked:]


def test_offline_fetch_names_what_the_cache_lacks(run_trainer, tmp_path: Path) -> None:
    env = {**run_env(tmp_path, model=MODEL_ID, tokenizer="org/some-tokenizer"), "HF_HUB_OFFLINE": "1"}
    result = run_trainer(["fetch"], env=env)
    assert result.returncode == 2, result.stderr
    assert f"TRAIN_MODEL={MODEL_ID}: revision 'main' is not in the cache" in result.stderr
    assert "TRAIN_TOKENIZER=org/some-tokenizer: revision 'main' is not in the cache" in result.stderr


def test_fetch_with_only_local_settings_has_nothing_to_do(run_trainer, tmp_path: Path) -> None:
    result = run_trainer(["fetch"], env=run_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "nothing to fetch" in result.stdout
