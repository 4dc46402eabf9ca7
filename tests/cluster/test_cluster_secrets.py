"""Secrets by value, not only by name (issue 26, item 11): no job file scripts/cluster.py writes holds one.

A password inside HF_ENDPOINT or a proxy URL is a secret although its variable's name says nothing: it goes to the
secrets file (Slurm) or the Kubernetes Secret like HF_TOKEN, and still reaches the container intact. A token in
TRAIN_ARGS is refused (exit 2, pointing at HF_TOKEN / HF_TOKEN_PATH), as the trainer refuses it. Job files are
readable by their owner only.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_cluster_slurm import fake_bin, job_env

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "registry.example.com/trainkit:0.1.0-cu128-ngc25.03"
TOKEN = "hf_tokenInArgs12345678"
PASSWORD = "mirrorPa55word"
PROXY_PASSWORD = "proxyPa55word"
ENDPOINT = f"https://trainer:{PASSWORD}@mirror.example/hf"
PROXY = f"http://me:{PROXY_PASSWORD}@proxy.example:3128"
VALUE_SECRETS = {"HF_ENDPOINT": ENDPOINT, "HTTPS_PROXY": PROXY}
SECRET_TEXTS = (TOKEN, PASSWORD, PROXY_PASSWORD, "hf_nameSecret99999")


def cluster(tmp_path: Path, env_text: str, target: str, out: Path) -> subprocess.CompletedProcess:
    env_file = tmp_path / ".env"
    env_file.write_text(env_text)
    where = ["--output-pvc", "runs"] if target == "k8s" else ["--output", str(tmp_path / "out")]
    cmd = [sys.executable, str(ROOT / "scripts" / "cluster.py"), target, "--env-file", str(env_file),
           "--image", IMAGE, *where, "-o", str(out)]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def job_env_text() -> str:
    return (
        "TRAIN_MODEL=tiny\nTRAIN_ARGS='--warmup_steps 5'\nHF_TOKEN=hf_nameSecret99999\n"
        f"HF_ENDPOINT={ENDPOINT}\nHTTPS_PROXY={PROXY}\n"
    )


@pytest.mark.parametrize("target", ["slurm-pyxis", "slurm-apptainer", "k8s"])
def test_a_token_in_train_args_is_refused(tmp_path: Path, target: str) -> None:
    out = tmp_path / "job"
    done = cluster(tmp_path, f"TRAIN_MODEL=tiny\nTRAIN_ARGS='--warmup_steps 5 --hub_token {TOKEN}'\n", target, out)
    assert done.returncode == 2, done.stderr
    assert "--hub_token holds a secret" in done.stderr and "HF_TOKEN_PATH" in done.stderr
    assert TOKEN not in done.stderr + done.stdout and "Traceback" not in done.stderr
    assert not out.exists() and not Path(f"{out}.secrets").exists()


@pytest.mark.parametrize("target", ["slurm-pyxis", "slurm-apptainer"])
def test_slurm_job_files_hold_no_secret_and_the_job_still_gets_them(tmp_path: Path, target: str) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text("an older job\n")
    script.chmod(0o755)  # a file from before: its mode is fixed too
    done = cluster(tmp_path, job_env_text(), target, script)
    assert done.returncode == 0, done.stderr
    text = script.read_text()
    assert not [s for s in SECRET_TEXTS if s in text]
    assert script.stat().st_mode & 0o777 == 0o700
    secrets = Path(f"{script}.secrets")
    assert secrets.stat().st_mode & 0o777 == 0o600
    assert PASSWORD in secrets.read_text() and PROXY_PASSWORD in secrets.read_text()
    assert "secrets kept out of it: HF_TOKEN, HF_ENDPOINT, HTTPS_PROXY" in done.stderr
    # the job, run with a stand-in srun, hands every value to the container intact
    env = job_env(tmp_path, fake_bin(tmp_path, "srun"), SLURM_JOB_ID="7", SLURM_NNODES="1",
                  SLURM_JOB_NODELIST="gpu-a01", SLURM_CPUS_ON_NODE="8")  # fmt: skip
    env.pop("HTTPS_PROXY", None)
    run = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    record = json.loads((tmp_path / "srun-all.json").read_text())
    prefix = "APPTAINERENV_" if target == "slurm-apptainer" else ""
    assert record["env"][f"{prefix}HF_ENDPOINT"] == ENDPOINT
    if target == "slurm-pyxis":
        container_env = next(a for a in record["argv"] if a.startswith("--container-env="))
        assert {"HF_ENDPOINT", "HTTPS_PROXY", "HF_TOKEN"} <= set(container_env.split("=", 1)[1].split(","))


def test_k8s_manifest_takes_value_secrets_from_the_secret(tmp_path: Path) -> None:
    manifest = tmp_path / "job.yaml"
    done = cluster(tmp_path, job_env_text(), "k8s", manifest)
    assert done.returncode == 0, done.stderr
    text = manifest.read_text()
    assert not [s for s in SECRET_TEXTS if s in text]
    assert manifest.stat().st_mode & 0o777 == 0o600
    job = yaml.safe_load(text)
    for spec in job["spec"]["pytorchReplicaSpecs"].values():
        env = {item["name"]: item for item in spec["template"]["spec"]["containers"][0]["env"]}
        for name in VALUE_SECRETS:
            assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "trainkit-secrets", "key": name}
        assert env["TRAIN_ARGS"] == {"name": "TRAIN_ARGS", "value": "--warmup_steps 5"}
    create = next(line for line in text.splitlines() if "kubectl create secret" in line)
    assert '--from-literal=HF_ENDPOINT="$HF_ENDPOINT"' in create
