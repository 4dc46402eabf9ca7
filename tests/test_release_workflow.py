"""The release pipeline (.github/workflows): actionlint-clean, and its job matrices are images/versions.toml's rows
(every CUDA row and the online-RL row on a tag, the default row nightly), one row per job, each pushed by digest with
an SBOM and a signature."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
VERSIONS = tomllib.loads((ROOT / "images" / "versions.toml").read_text())


def job_rows(job: str) -> list[dict]:
    workflow = yaml.safe_load((WORKFLOWS / "release.yml").read_text())
    return workflow["jobs"][job]["strategy"]["matrix"]["include"]


def test_the_tag_job_builds_every_row_of_versions_toml() -> None:
    """Every CUDA row, then the online-RL row ([rl]: its CUDA, NVIDIA's vLLM release from [vllm]'s image tag)."""
    rows = job_rows("release")
    expected = [{"cuda": cuda, "ngc": row["ngc"], "tag": "cu" + cuda.replace(".", "")}
                for cuda, row in VERSIONS["cuda"].items()]  # fmt: skip
    vllm_release = VERSIONS["vllm"]["server_image"].rsplit(":", 1)[1].removesuffix("-py3")
    expected.append({"cuda": VERSIONS["rl"]["cuda"], "ngc": vllm_release, "tag": "rl", "rl": True})
    assert rows == expected


def test_the_rl_row_job_builds_with_build_py_rl() -> None:
    """The `rl` input picks `build.py --rl` (build and push) and the row tests' `rl` key; a CUDA row's job keeps
    `--cuda X.Y`. The release job passes the matrix's `rl` through."""
    workflow = yaml.safe_load((WORKFLOWS / "build-row.yml").read_text())
    inputs = workflow[True]["workflow_call"]["inputs"]  # YAML 1.1 reads the key `on` as True
    assert inputs["rl"] == {"description": inputs["rl"]["description"], "type": "boolean", "default": False}
    steps = workflow["jobs"]["image"]["steps"]
    runs = "\n".join(step.get("run", "") for step in steps)
    assert 'echo "ROW_ARGS=--rl"' in runs and 'echo "ROW_ARGS=--cuda $CUDA"' in runs and 'echo "ROW=rl"' in runs
    builds = [line.strip() for line in runs.splitlines() if "scripts/build.py" in line]
    assert len(builds) == 2 and all(line.startswith("python scripts/build.py $ROW_ARGS ") for line in builds), builds
    assert '--row-image "$ROW=$IMAGE"' in runs
    release = yaml.safe_load((WORKFLOWS / "release.yml").read_text())
    assert release["jobs"]["release"]["with"]["rl"] == "${{ matrix.rl || false }}"


def test_the_job_matrices_are_generated_and_checked() -> None:
    """The matrices are scripts/generate.py's blocks: a row edited by hand is drift that `--check` names."""
    workflow = WORKFLOWS / "release.yml"
    original = workflow.read_text()
    try:
        workflow.write_text(original.replace('tag: cu128}', 'tag: cu128x}', 1))
        result = subprocess.run([sys.executable, "scripts/generate.py", "--check"], cwd=ROOT, capture_output=True,
                                text=True, timeout=120)  # fmt: skip
    finally:
        workflow.write_text(original)
    assert result.returncode == 1 and ".github/workflows/release.yml" in result.stderr


def test_the_nightly_job_builds_the_default_row() -> None:
    default = VERSIONS["default_cuda"]
    assert [row["cuda"] for row in job_rows("nightly")] == [default]
    assert job_rows("nightly")[0]["ngc"] == VERSIONS["cuda"][default]["ngc"]


def test_each_row_job_pushes_by_digest_writes_an_sbom_and_signs() -> None:
    steps = yaml.safe_load((WORKFLOWS / "build-row.yml").read_text())["jobs"]["image"]["steps"]
    runs = "\n".join(step.get("run", "") for step in steps)
    uses = [step.get("uses", "").split("@")[0] for step in steps]
    assert "--push" in runs and '["pushed"]' in runs  # build.py records repo@sha256 for each pushed tag
    assert "anchore/sbom-action" in uses and "sigstore/cosign-installer" in uses
    assert 'cosign sign --yes "$DIGEST_REF"' in runs and "cosign attest" in runs
    assert "--row-image" in runs and "verify.py" in runs


def test_actionlint_passes() -> None:
    actionlint = shutil.which("actionlint") or str(Path(sys.executable).parent / "actionlint")
    if not Path(actionlint).exists():
        pytest.fail("actionlint is missing: `pip install -e '.[dev]'` installs it (tests/run.sh does)")
    proc = subprocess.run([actionlint], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
