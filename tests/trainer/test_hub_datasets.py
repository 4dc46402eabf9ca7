"""TRAIN_DATA / TRAIN_EVAL_DATA as Hub datasets (hf://datasets/org/name[@revision][/path]): only the data files the
path names are fetched; the train split trains, the validation split evaluates; `fetch` then an offline run; a
pre-populated cache offline; mistakes exit 2."""

from __future__ import annotations

import json
from pathlib import Path

from hub_server import populate_cache
from hub_support import online, run_config, run_env

DATASET = "org/corpus"


def _jsonl(lines: int, lang: str) -> bytes:
    return "".join(json.dumps({"text": f"{lang} sentence {i} about the Hub."}) + "\n" for i in range(lines)).encode()


FILES = {
    "en/train.jsonl": _jsonl(300, "en"),
    "en/validation.jsonl": _jsonl(40, "en"),
    "fr/train.jsonl": _jsonl(300, "fr"),
    "README.md": b"# corpus\n",
    "corpus.py": b"raise SystemExit('a loading script is never run')\n",
}


def _evals(out: Path) -> list[dict]:
    return [x for x in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "eval_loss" in x]


def test_fetch_a_hub_dataset_then_train_and_evaluate_offline(run_trainer, tmp_path: Path, hub) -> None:
    sha = hub.repo(DATASET, "datasets").commit(FILES)
    env = run_env(tmp_path, data=f"hf://datasets/{DATASET}/en", eval_data=f"hf://datasets/{DATASET}/en",
                  eval_steps=2)  # fmt: skip
    fetched = run_trainer(["fetch"], env=online(env, hub))
    assert fetched.returncode == 0, fetched.stderr
    assert f"TRAIN_DATA={DATASET}@main -> commit {sha}" in fetched.stdout
    files = f"GET /datasets/{DATASET}/resolve/{sha}/"
    downloaded = {r.removeprefix(files) for r in hub.requests if r.startswith(files)}
    assert downloaded == {"en/train.jsonl", "en/validation.jsonl"}
    asked = len(hub.requests)
    result = run_trainer(["train"], env={**env, "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(hub.requests) == asked
    config = run_config(tmp_path / "output")
    assert config["hub"]["data"] == {"repo_id": DATASET, "repo_type": "dataset", "revision": "main", "sha": sha}
    assert config["hub"]["eval_data"]["sha"] == sha
    assert f"Hub dataset {DATASET} at commit {sha}" in config["decisions"]["data"]["reason"]
    assert "split 'train'" in config["decisions"]["data"]["reason"]
    assert "split 'validation'" in result.stderr and [e["step"] for e in _evals(tmp_path / "output")] == [2]


def test_hub_dataset_glob_from_a_populated_cache_offline(run_trainer, tmp_path: Path) -> None:
    env = run_env(tmp_path, data=f"hf://datasets/{DATASET}@v1/fr/*.jsonl")
    populate_cache(Path(env["HF_HOME"]), DATASET, FILES, "b" * 40, branch="v1", kind="datasets")
    result = run_trainer(["train"], env={**env, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert run_config(tmp_path / "output")["hub"]["data"]["sha"] == "b" * 40
    assert run_config(tmp_path / "output")["hub"]["data"]["revision"] == "v1"


def test_hub_dataset_mistakes_exit_2(run_trainer, tmp_path: Path, hub) -> None:
    hub.repo(DATASET, "datasets").commit(FILES)
    env = online(run_env(tmp_path), hub)
    empty = run_trainer(["train"], env={**env, "TRAIN_DATA": f"hf://datasets/{DATASET}/de"})
    assert empty.returncode == 2 and f"TRAIN_DATA=hf://datasets/{DATASET}/de: no data files at 'de'" in empty.stderr
    missing = run_trainer(["train"], env={**env, "TRAIN_EVAL_DATA": "hf://datasets/org/nothing"})
    assert missing.returncode == 2 and "TRAIN_EVAL_DATA=hf://datasets/org/nothing: not found" in missing.stderr
    offline = run_trainer(["train"], env={**env, "TRAIN_DATA": f"hf://datasets/{DATASET}", "HF_HUB_OFFLINE": "1"})
    assert offline.returncode == 2 and "is not in the cache" in offline.stderr
    assert all("Traceback" not in r.stderr for r in (empty, missing, offline))
