"""The Kubernetes PyTorchJob manifest: valid against the Kubeflow CRD's schema, and what each pod needs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CRD = Path(__file__).parent / "data" / "pytorchjobs.crd.v1.9.0.yaml"
SECRET = "hf_never_in_manifest"


@pytest.fixture(scope="module")
def schema() -> dict:
    crd = yaml.safe_load(CRD.read_text())
    assert crd["spec"]["names"]["kind"] == "PyTorchJob"
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return version["schema"]["openAPIV3Schema"]


def manifest(tmp_path: Path, *extra: str) -> dict:
    env_file = tmp_path / ".env"
    env_file.write_text(f"TRAIN_MODEL=tiny\nTRAIN_BATCH_SIZE=4\nHF_TOKEN={SECRET}\nWANDB_API_KEY=wandb_secret_xyz\n")
    out = tmp_path / "job.yaml"
    cmd = [sys.executable, str(ROOT / "scripts" / "cluster.py"), "k8s", "--env-file", str(env_file),
           "--image", "registry.example.com/trainkit:0.1.0-cu128-ngc25.03", "--output-pvc", "runs", "-o", str(out),
           *extra]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    text = out.read_text()
    assert SECRET not in text and "wandb_secret_xyz" not in text
    return yaml.safe_load(text)


def validate(schema: dict, job: dict) -> None:
    jsonschema.validate(job, schema, cls=jsonschema.Draft7Validator)
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob"


def pods(job: dict) -> dict[str, dict]:
    return {role: spec["template"]["spec"] for role, spec in job["spec"]["pytorchReplicaSpecs"].items()}


def test_multi_node_manifest_is_valid_and_complete(tmp_path: Path, schema: dict) -> None:
    job = manifest(tmp_path, "--nodes", "4", "--gpus-per-node", "8", "--data-pvc", "corpus", "--shm-size", "32Gi",
                   "--grace-period", "1200", "--namespace", "ml")  # fmt: skip
    validate(schema, job)
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert {role: r["replicas"] for role, r in replicas.items()} == {"Master": 1, "Worker": 3}
    # ExitCode: 143 (SIGTERM) and 137 (OOM kill) recreate the pod, 2 (a user mistake) fails the job at once
    assert all(r["restartPolicy"] == "ExitCode" for r in replicas.values())
    policy = job["spec"]["runPolicy"]
    assert policy["cleanPodPolicy"] == "Running"  # a failed job's pods do not keep holding GPUs
    assert policy["backoffLimit"] == 12  # 3 restarts per pod: the limit counts all pods' restarts together
    assert policy["schedulingPolicy"] == {"minAvailable": 4}
    assert job["spec"]["nprocPerNode"] == "8" and job["metadata"]["namespace"] == "ml"
    for pod in pods(job).values():
        assert pod["terminationGracePeriodSeconds"] == 1200
        (container,) = pod["containers"]
        # the operator takes MASTER_PORT from this container and port name
        assert container["name"] == "pytorch" and container["ports"][0]["name"] == "pytorchjob-port"
        assert container["resources"]["limits"] == {"nvidia.com/gpu": 8}
        assert container["resources"]["requests"] == {"memory": "32Gi"}  # the memory-backed /dev/shm counts
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert volumes[mounts["/dev/shm"]["name"]]["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
        assert volumes[mounts["/data"]["name"]]["persistentVolumeClaim"] == {"claimName": "corpus", "readOnly": True}
        assert mounts["/data"]["readOnly"] is True
        assert volumes[mounts["/output"]["name"]]["persistentVolumeClaim"]["claimName"] == "runs"
        env = {e["name"]: e for e in container["env"]}
        assert env["TRAIN_MODEL"] == {"name": "TRAIN_MODEL", "value": "tiny"}
        assert env["TRAINKIT_IMAGE"]["value"] == "registry.example.com/trainkit:0.1.0-cu128-ngc25.03"  # provenance
        assert env["WANDB_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "trainkit-secrets", "key": "WANDB_API_KEY"}
        # the Hub token as a file from the Secret (HF_TOKEN_PATH), in no process environment
        assert "HF_TOKEN" not in env
        assert env["HF_TOKEN_PATH"] == {"name": "HF_TOKEN_PATH", "value": "/run/secrets/trainkit/HF_TOKEN"}
        token = volumes[mounts["/run/secrets/trainkit"]["name"]]["secret"]
        assert token == {"secretName": "trainkit-secrets", "items": [{"key": "HF_TOKEN", "path": "HF_TOKEN"}],
                         "defaultMode": 0o440}  # fmt: skip
        assert mounts["/run/secrets/trainkit"]["readOnly"] is True
        assert container["args"] == ["train"] and "command" not in container  # keeps the image's ENTRYPOINT


def test_grace_period_outlasts_the_launchers_shutdown_wait(tmp_path: Path, schema: dict) -> None:
    """SIGTERM -> torchrun gives workers TORCH_ELASTIC_SHUTDOWN_TIMEOUT to checkpoint -> kubelet's SIGKILL after."""
    from trainer.launch.decide import WORKER_ENV_DEFAULTS

    job = manifest(tmp_path)
    validate(schema, job)
    for pod in pods(job).values():
        assert pod["terminationGracePeriodSeconds"] > int(WORKER_ENV_DEFAULTS["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"])


def test_single_gpu_and_cpu_pods(tmp_path: Path, schema: dict) -> None:
    one = manifest(tmp_path, "--nodes", "1", "--gpus-per-node", "1")
    validate(schema, one)
    assert list(one["spec"]["pytorchReplicaSpecs"]) == ["Master"]
    cpu = manifest(tmp_path, "--gpus-per-node", "0", "--cpus-per-task", "4", "--mem", "16Gi")
    validate(schema, cpu)
    (container,) = pods(cpu)["Master"]["containers"]
    assert "limits" not in container["resources"]
    assert container["resources"]["requests"] == {"cpu": "4", "memory": "32Gi"}  # 16Gi + the 16Gi /dev/shm
    assert one["spec"]["runPolicy"]["backoffLimit"] == 3


def test_schema_rejects_a_broken_manifest(tmp_path: Path, schema: dict) -> None:
    """The validation above can fail: a wrong type or a missing required field is caught."""
    job = manifest(tmp_path, "--nodes", "2")
    broken = json.loads(json.dumps(job))
    broken["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "one"
    with pytest.raises(jsonschema.ValidationError):
        validate(schema, broken)
    del job["spec"]["pytorchReplicaSpecs"]
    with pytest.raises(jsonschema.ValidationError):
        validate(schema, job)


def test_job_name_must_be_a_dns_label(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "cluster.py"), "k8s", "--image", "x",
                           "--output-pvc", "o", "--job-name", "My_Job"], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 2 and "--job-name" in done.stderr and "Traceback" not in done.stderr


def test_default_image_comes_from_the_version_matrix(tmp_path: Path) -> None:
    code = "import matrix; print(matrix.default_image(gpu=True))"
    found = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "scripts", capture_output=True, text=True)
    expected = found.stdout.strip()
    out = tmp_path / "job.yaml"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "cluster.py"), "k8s", "--output-pvc", "o", "-o", str(out)],
                   check=True, capture_output=True, cwd=tmp_path)  # fmt: skip
    (container,) = pods(yaml.safe_load(out.read_text()))["Master"]["containers"]
    assert container["image"] == expected and expected.startswith("trainkit:")


def test_scheduling_fields(tmp_path: Path, schema: dict) -> None:
    job = manifest(tmp_path, "--nodes", "2", "--toleration", "nvidia.com/gpu:NoSchedule", "--toleration",
                   "pool=training:NoExecute", "--node-selector", "gpu=h100", "--image-pull-secret", "regcred",
                   "--service-account", "trainer", "--priority-class", "high", "--queue", "team-a",
                   "--ttl-after-finished", "3600", "--active-deadline", "86400", "--backoff-limit", "5",
                   "--mem", "200Gi", "--shm-size", "512Mi")  # fmt: skip
    validate(schema, job)
    assert job["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "team-a"}
    policy = job["spec"]["runPolicy"]
    assert policy["backoffLimit"] == 5 and policy["ttlSecondsAfterFinished"] == 3600
    assert policy["activeDeadlineSeconds"] == 86400
    assert policy["schedulingPolicy"] == {"minAvailable": 2, "priorityClass": "high", "queue": "team-a"}
    for pod in pods(job).values():
        assert pod["tolerations"] == [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "pool", "operator": "Equal", "value": "training", "effect": "NoExecute"},
        ]
        assert pod["nodeSelector"] == {"gpu": "h100"} and pod["imagePullSecrets"] == [{"name": "regcred"}]
        assert pod["serviceAccountName"] == "trainer" and pod["priorityClassName"] == "high"
        assert pod["containers"][0]["resources"]["requests"]["memory"] == "205312Mi"  # 200Gi + 512Mi


@pytest.mark.parametrize(("option", "value"), [("--toleration", "a:Sometimes"), ("--node-selector", "gpu"),
                                                ("--shm-size", "lots")])  # fmt: skip
def test_bad_scheduling_values_exit_2(tmp_path: Path, option: str, value: str) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "cluster.py"), "k8s", "--image", "x",
                           "--output-pvc", "o", option, value], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 2 and option in done.stderr and "Traceback" not in done.stderr


def test_elastic_job(tmp_path: Path, schema: dict) -> None:
    job = manifest(tmp_path, "--nodes", "3", "--elastic", "2:4", "--max-restarts", "7")
    validate(schema, job)
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Worker"]
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    policy = {"rdzvBackend": "c10d", "minReplicas": 2, "maxReplicas": 4, "maxRestarts": 7}
    assert job["spec"]["elasticPolicy"] == policy
    assert job["spec"]["runPolicy"]["schedulingPolicy"]["minAvailable"] == 2
    for bad in (["--elastic", "4:2"], ["--elastic", "2:4", "--nodes", "5"], ["--elastic", "two"]):
        done = subprocess.run([sys.executable, str(ROOT / "scripts" / "cluster.py"), "k8s", "--image", "x",
                               "--output-pvc", "o", *bad], capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 2 and "--elastic" in done.stderr and "Traceback" not in done.stderr


def test_rdma_resource_is_requested_with_ipc_lock(tmp_path, schema) -> None:
    job = manifest(tmp_path, "--nodes", "2", "--gpus-per-node", "8", "--rdma-resource", "rdma/ib=1")
    validate(schema, job)
    for pod in pods(job).values():
        container = pod["containers"][0]
        assert container["resources"]["limits"]["rdma/ib"] == 1
        assert container["resources"]["requests"]["rdma/ib"] == 1
        assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]


def test_without_rdma_no_capability_is_added(tmp_path, schema) -> None:
    job = manifest(tmp_path, "--nodes", "2", "--gpus-per-node", "8")
    assert all("add" not in pod["containers"][0]["securityContext"]["capabilities"] for pod in pods(job).values())


def test_pods_run_as_non_root_without_privileges(tmp_path: Path, schema: dict) -> None:
    """Issue 26, item 12: the image's non-root user, no privilege escalation, every capability dropped."""
    job = manifest(tmp_path, "--nodes", "2", "--gpus-per-node", "8")
    validate(schema, job)
    for pod in pods(job).values():
        assert pod["securityContext"] == {
            "runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
            "fsGroupChangePolicy": "OnRootMismatch", "seccompProfile": {"type": "RuntimeDefault"},
        }  # fmt: skip
        (container,) = pod["containers"]
        assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    other = manifest(tmp_path, "--run-as", "4321:99", "--rdma-resource", "rdma/ib=1")
    validate(schema, other)
    pod = pods(other)["Master"]
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["fsGroup"]) == (4321, 99)
    assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    # the CRD's schema checks these fields: a wrong type is caught
    pod["securityContext"]["runAsUser"] = "root"
    with pytest.raises(jsonschema.ValidationError):
        validate(schema, other)
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "cluster.py"), "k8s", "--image", "x",
                           "--output-pvc", "o", "--run-as", "0"], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 2 and "--run-as" in done.stderr and "non-root" in done.stderr
