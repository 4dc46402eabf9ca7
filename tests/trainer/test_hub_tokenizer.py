"""TRAIN_TOKENIZER: a preset trained from scratch with a real tokenizer, from a folder or a Hub ID (only the
tokenizer files are fetched); the byte-level tokenizer stays the default."""

from __future__ import annotations

import json
from pathlib import Path

from hub_support import online, run_config, run_env, save_bpe_tokenizer

TOKENIZER_ID = "org/bpe-tokenizer"


def _vocab_of(final: Path) -> int:
    return json.loads((final / "config.json").read_text())["vocab_size"]


def _rows_for(tokenizer: Path) -> int:
    """The embedding rows a preset gets for this tokenizer: its size rounded up to a multiple of 64."""
    size = len(json.loads((tokenizer / "tokenizer.json").read_text())["model"]["vocab"])
    assert size > 300
    return (size + 63) // 64 * 64


def test_hub_tokenizer_trains_a_preset_and_fetches_only_tokenizer_files(run_trainer, tmp_path: Path, hub) -> None:
    files = save_bpe_tokenizer(tmp_path / "bpe")
    sha = hub.repo(TOKENIZER_ID).commit({**files, "model.safetensors": b"not wanted" * 1000})
    env = online(run_env(tmp_path, tokenizer=TOKENIZER_ID), hub)
    result = run_trainer(["train"], env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "output"
    assert run_config(out)["hub"]["tokenizer"]["sha"] == sha and "model" not in run_config(out)["hub"]
    snapshot = Path(env["HF_HOME"]) / "hub" / "models--org--bpe-tokenizer" / "snapshots" / sha
    assert (snapshot / "tokenizer.json").is_file() and not (snapshot / "model.safetensors").exists()
    assert json.loads((out / "final" / "tokenizer.json").read_text())["model"]["type"] == "BPE"
    assert _vocab_of(out / "final") == _rows_for(tmp_path / "bpe") > 320  # the byte-level one gives 320
    assert not any(r.endswith("/model.safetensors") for r in hub.requests)


def test_tokenizer_folder_and_the_byte_level_default(run_trainer, tmp_path: Path) -> None:
    save_bpe_tokenizer(tmp_path / "bpe")
    with_folder = run_trainer(["train"], env=run_env(tmp_path, tokenizer=tmp_path / "bpe"))
    assert with_folder.returncode == 0, with_folder.stderr[-3000:]
    assert _vocab_of(tmp_path / "output" / "final") == _rows_for(tmp_path / "bpe")
    default = tmp_path / "default"
    result = run_trainer(["train"], env={**run_env(tmp_path), "TRAIN_OUTPUT_DIR": str(default)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert _vocab_of(default / "final") == 320 and "byte-level, 259 tokens" in result.stderr


def test_tokenizer_mistakes_exit_2(run_trainer, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    no_files = run_trainer(["train"], env=run_env(tmp_path, tokenizer=tmp_path / "empty"))
    assert no_files.returncode == 2 and "the folder has none of tokenizer.json" in no_files.stderr
    missing = run_trainer(["train"], env=run_env(tmp_path, tokenizer="./no/such/tokenizer"))
    assert missing.returncode == 2 and "neither an existing folder nor a Hub ID" in missing.stderr
