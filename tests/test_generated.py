"""Derived docs and defaults are regenerated from their sources, never edited apart from them."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_generated_files_match_their_sources():
    result = subprocess.run(
        [sys.executable, "scripts/generate.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_readme_documents_every_train_variable():
    sys.path.insert(0, str(ROOT))
    from trainer.config.schema import TrainSettings, env_name

    readme = (ROOT / "README.md").read_text()
    env_example = (ROOT / ".env.example").read_text()
    for field in TrainSettings.model_fields:
        assert f"`{env_name(field)}`" in readme, env_name(field)
        assert f"# {env_name(field)}=" in env_example, env_name(field)


def test_check_detects_drift(tmp_path):
    """The drift check is real: a README whose table was edited by hand fails it."""
    readme = ROOT / "README.md"
    original = readme.read_text()
    try:
        readme.write_text(original.replace("| `TRAIN_SEQ_LEN` |", "| `TRAIN_SEQ_LENGTH` |", 1))
        result = subprocess.run(
            [sys.executable, "scripts/generate.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
    finally:
        readme.write_text(original)
    assert result.returncode == 1
    assert "README.md" in result.stderr
