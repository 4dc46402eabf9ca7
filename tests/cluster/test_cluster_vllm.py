"""TRAIN_RL_ENGINE=vllm in the jobs (scripts/cluster.py --vllm-server) and the server's start script.

No GPU, NGC image or cluster here: the jobs are generated and read (bash -n, the Kubeflow CRD's schema), and the start
script runs for real under sh with stand-ins for what the vLLM image holds (a `vllm` module with a version, a `vllm`
command that records its arguments): its version check and the `vllm serve` line are what is proven.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from test_cluster_k8s import schema  # noqa: F401 (the fixture)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import cluster_slurm  # noqa: E402
import cluster_vllm  # noqa: E402
import matrix  # noqa: E402

IMAGE = "registry.example.com/team/trainkit@sha256:" + "a" * 64  # pinned: no registry lookup
PINNED = matrix.load().vllm
ENV = "TRAIN_MODEL=/models/qwen\nTRAIN_METHOD=grpo\nTRAIN_REWARD=exact\nTRAIN_RL_ENGINE=vllm\nHF_TOKEN=hf_secret_x1\n"


def cluster(tmp_path: Path, target: str, *extra: str, env: str = ENV) -> subprocess.CompletedProcess[str]:
    (tmp_path / ".env").write_text(env)
    (tmp_path / "data").mkdir(exist_ok=True)
    where = ["--output-pvc", "runs"] if target == "k8s" else ["--data", str(tmp_path / "data"), "--output",
                                                              str(tmp_path / "out")]  # fmt: skip
    cmd = [sys.executable, str(ROOT / "scripts" / "cluster.py"), target, "--env-file", str(tmp_path / ".env"),
           "--image", IMAGE, "-o", str(tmp_path / "job"), *where, *extra]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


@pytest.mark.parametrize("target", ["slurm-pyxis", "slurm-apptainer"])
def test_slurm_job_starts_the_server_on_its_own_node(tmp_path: Path, target: str) -> None:
    done = cluster(tmp_path, target, "--nodes", "2", "--vllm-server")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "job").read_text()
    subprocess.run(["bash", "-n", str(tmp_path / "job")], check=True)
    assert "#SBATCH --nodes=3" in text.splitlines() and "hf_secret_x1" not in text
    server, training = text.split("TRAINKIT_VLLM_STEP=$!", 1)
    image = cluster_slurm.pyxis_image(PINNED.image) if target == "slurm-pyxis" else f"docker://{PINNED.image}"
    assert image in server
    assert '--nodelist="$TRAINKIT_VLLM_NODE"' in server and "exec vllm serve" in server
    assert 'export TRAIN_RL_VLLM_URL="http://$TRAINKIT_VLLM_NODE:8000"' in training
    assert '--nodes=2 \\\n    --exclude="$TRAINKIT_VLLM_NODE"' in training


def test_kubernetes_job_adds_a_server_deployment_and_service(tmp_path: Path, schema: dict) -> None:  # noqa: F811
    done = cluster(tmp_path, "k8s", "--nodes", "2", "--vllm-server", "--vllm-gpus", "2")
    assert done.returncode == 0, done.stderr
    job, deployment, service = yaml.safe_load_all((tmp_path / "job").read_text())
    jsonschema.validate(job, schema, cls=jsonschema.Draft7Validator)
    trainer = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert {"name": "TRAIN_RL_VLLM_URL", "value": "http://trainkit-vllm:8000"} in trainer["env"]
    pod = deployment["spec"]["template"]["spec"]
    server = pod["containers"][0]
    assert (deployment["kind"], service["kind"]) == ("Deployment", "Service")
    assert service["metadata"]["name"] == "trainkit-vllm"
    assert server["image"] == PINNED.image and server["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert "--tensor-parallel-size 2" in server["command"][-1]
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]


def test_server_options_are_checked(tmp_path: Path) -> None:
    unpinned = cluster(tmp_path, "k8s", "--vllm-server", "--vllm-require-digest")
    assert unpinned.returncode == 2 and "is not pinned by digest" in unpinned.stderr
    assert "Traceback" not in unpinned.stderr
    wrong = cluster(tmp_path, "k8s", "--vllm-server", env=ENV.replace("TRAIN_RL_ENGINE=vllm\n", ""))
    assert wrong.returncode == 2 and "TRAIN_RL_ENGINE=transformers" in wrong.stderr, wrong.stderr
    pinned = cluster(tmp_path, "k8s", "--vllm-server", "--vllm-require-digest", "--vllm-image", IMAGE)
    assert pinned.returncode == 0, pinned.stderr


def serve(tmp_path: Path, version: str, model: str = "/models/qwen") -> subprocess.CompletedProcess[str]:
    """The start script under sh, in a stand-in of the vLLM image: its `vllm` module and command."""
    (tmp_path / "vllm.py").write_text(f"__version__ = {version!r}\n")
    command = tmp_path / "vllm"
    command.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                       "print(json.dumps([sys.argv[1:], os.environ.get('VLLM_SERVER_DEV_MODE')]))\n")  # fmt: skip
    command.chmod(0o755)
    (tmp_path / "python3").symlink_to(sys.executable)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "PYTHONPATH": str(tmp_path), "TRAIN_MODEL": model,
           "TRAINKIT_VLLM_ARGS": "--max-model-len 4096"}  # fmt: skip
    script = cluster_vllm.serve_script(*PINNED.trl_range)
    return subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, check=False)


def test_the_start_script_checks_the_image_vllm_against_trls_range(tmp_path: Path) -> None:
    for folder in "abc":
        (tmp_path / folder).mkdir()
    inside = serve(tmp_path / "a", "0.25.1+cu129")
    assert inside.returncode == 0, inside.stderr
    argv, dev_mode = json.loads(inside.stdout)
    assert argv[:2] == ["serve", "/models/qwen"] and dev_mode == "1"
    assert argv[argv.index("--weight-transfer-config") + 1] == '{"backend": "nccl"}'
    assert argv[-2:] == ["--max-model-len", "4096"]
    newer = serve(tmp_path / "b", "0.33.0")
    assert newer.returncode == 2 and not newer.stdout
    assert "vLLM 0.33.0, TRL supports 0.22.0 to 0.31.0" in newer.stderr and "pick another tag" in newer.stderr
    assert "TRAIN_MODEL is not set" in serve(tmp_path / "c", "0.25.1", model="").stderr
