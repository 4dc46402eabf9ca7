"""docker-compose.yml / docker-compose.cpu.yml as compose resolves them (no engine needed, only compose v2)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import matrix  # noqa: E402

pytestmark = pytest.mark.skipif(
    shutil.which("docker") is None
    or subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode != 0,
    reason="needs docker compose v2",
)


def resolved(folder: Path, *files: str, env: dict[str, str] | None = None) -> dict:
    args = ["--profile", "*", "--project-directory", str(folder)]
    args += [arg for name in files for arg in ("-f", str(ROOT / name))]
    result = subprocess.run(
        ["docker", "compose", *args, "config", "--format", "json"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", **(env or {})},
        check=True,
    )
    return json.loads(result.stdout)


def default_of(text: str, variable: str) -> str:
    match = re.search(r"\$\{" + variable + r":-([^}]*)\}", text)
    assert match, f"no ${{{variable}:-...}} default"
    return match[1]


def test_defaults_follow_the_matrix():
    gpu = (ROOT / "docker-compose.yml").read_text()
    cpu = (ROOT / "docker-compose.cpu.yml").read_text()
    m = matrix.load()
    assert default_of(gpu, "TRAINKIT_IMAGE") == matrix.compose_defaults(m)["image"]
    assert default_of(gpu, "TRAINKIT_BASE_IMAGE") == matrix.compose_defaults(m)["BASE_IMAGE"]
    assert default_of(cpu, "TRAINKIT_CPU_IMAGE") == matrix.default_image(gpu=False)
    assert default_of(cpu, "TRAINKIT_CPU_BASE_IMAGE") == m.cpu.base_image


def test_gpu_services_run_safely_as_the_user(tmp_path):
    config = resolved(tmp_path, "docker-compose.yml", env={"TRAINKIT_UID": "1234", "TRAINKIT_GID": "99"})
    train = config["services"]["train"]
    assert train["command"] == ["train"]
    assert train["user"] == "1234:99"
    assert train["restart"] == "on-failure:3"
    assert train["ipc"] == "host"
    assert train["ulimits"] == {"memlock": -1, "stack": 67108864}
    devices = train["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and devices[0]["count"] == -1
    mounts = {v["target"]: v for v in train["volumes"]}
    assert mounts["/data"]["read_only"] and mounts["/models"]["read_only"]
    assert mounts["/data"]["source"] == str(tmp_path / "data")
    assert not mounts["/output"].get("read_only")
    assert mounts["/cache"]["type"] == "volume"
    assert config["volumes"]["cache"]["name"] == "trainkit-cache"
    assert "HF_TOKEN" in train["environment"] and train["environment"]["HF_TOKEN"] is None  # taken at run time
    assert "HF_TOKEN" not in json.dumps(train.get("build", {}))
    grace = train["stop_grace_period"]
    assert grace.endswith("m0s") and int(grace.split("m")[0]) >= 5
    assert config["services"]["doctor"]["profiles"] == ["doctor"]
    assert config["services"]["bench"]["command"] == ["bench"]


def test_unexported_uid_falls_back_and_env_file_is_optional(tmp_path):
    train = resolved(tmp_path, "docker-compose.yml")["services"]["train"]
    assert train["user"] == "1000:1000"
    (tmp_path / ".env").write_text("TRAINKIT_UID=4321\nTRAIN_MAX_STEPS=7\n")
    train = resolved(tmp_path, "docker-compose.yml")["services"]["train"]
    assert train["user"] == "4321:1000"
    assert train["environment"]["TRAIN_MAX_STEPS"] == "7"


def test_cpu_layer_drops_gpus_and_uses_the_cpu_image(tmp_path):
    config = resolved(tmp_path, "docker-compose.yml", "docker-compose.cpu.yml")
    for name in ("train", "doctor", "bench"):
        service = config["services"][name]
        assert "deploy" not in service or not service["deploy"].get("resources"), name
        assert service["image"] == "trainkit:latest-cpu"
        assert service["build"]["args"]["FLAVOR"] == "cpu"
    assert config["services"]["train"]["ulimits"]["memlock"] == -1


def test_infiniband_override_adds_the_devices_and_ipc_lock(tmp_path: Path) -> None:
    train = resolved(tmp_path, "docker-compose.yml", "docker-compose.ib.yml")["services"]["train"]
    assert [d["source"] for d in train["devices"]] == ["/dev/infiniband"]
    assert train["cap_add"] == ["IPC_LOCK"]


def test_fetch_service_fills_the_cache_volume_without_gpus(tmp_path):
    for files in (("docker-compose.yml",), ("docker-compose.yml", "docker-compose.cpu.yml")):
        fetch = resolved(tmp_path, *files)["services"]["fetch"]
        assert fetch["command"] == ["fetch"] and fetch["profiles"] == ["fetch"]
        assert "deploy" not in fetch or not fetch["deploy"].get("resources"), "fetch needs no GPU"
        assert any(v.get("target") == "/cache" and v.get("type") == "volume" for v in fetch["volumes"])
        assert "HF_TOKEN" in fetch["environment"] and fetch["environment"]["HF_TOKEN"] is None


def test_export_and_push_services_run_their_command_without_gpus(tmp_path):
    """`docker compose run --rm export [SRC OUT]` and `... push SRC REPO`: the arguments replace the default ones only;
    the Hub token and the W&B key pass from the shell, never stored."""
    for files in (("docker-compose.yml",), ("docker-compose.yml", "docker-compose.cpu.yml")):
        services = resolved(tmp_path, *files)["services"]
        export, push = services["export"], services["push"]
        assert export["entrypoint"][-1] == "export" and export["command"] == ["/output", "/output/export"]
        assert push["entrypoint"][-1] == "push" and push["command"] == ["/output/export"]
        for service in (export, push):
            assert "deploy" not in service or not service["deploy"].get("resources"), "no GPU needed"
            assert service["environment"]["HF_TOKEN"] is None and service["environment"]["WANDB_API_KEY"] is None
        assert services["train"]["environment"]["WANDB_API_KEY"] is None
        generate, evaluate = services["generate"], services["eval"]  # on the GPUs where the engine has them
        assert generate["entrypoint"][-1] == "generate" and generate["command"] == ["/output"]
        assert evaluate["entrypoint"][-1] == "eval" and evaluate["command"][0] == "/output"
        gpus = len(files) == 1
        assert all(bool(s.get("deploy", {}).get("resources")) == gpus for s in (generate, evaluate))


def test_vllm_service_serves_with_the_pinned_image_and_the_one_start_script(tmp_path):
    """TRAIN_RL_ENGINE=vllm's server (profile `vllm`): images/versions.toml's image (by digest once recorded), its
    own GPU, and scripts/cluster_vllm.py's start script (the one the Slurm/Kubernetes jobs run) word for word."""
    import cluster_vllm

    vllm = resolved(tmp_path, "docker-compose.yml")["services"]["vllm"]
    pinned = matrix.load().vllm
    assert vllm["profiles"] == ["vllm"] and vllm["image"] == pinned.image
    assert default_of((ROOT / "docker-compose.yml").read_text(), "TRAINKIT_VLLM_IMAGE") == pinned.image
    assert vllm["entrypoint"] == ["/bin/sh", "-c"]
    assert vllm["command"][0].replace("$$", "$") == cluster_vllm.serve_script(*pinned.trl_range)
    assert vllm["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == ["0"]
    assert vllm["environment"]["HF_TOKEN"] is None and vllm["ipc"] == "host"


def test_serve_publishes_on_this_machine_only_and_check_runs_in_its_network(tmp_path):
    """`docker compose up serve`: the export on the container's interfaces, published on 127.0.0.1 only, no GPU;
    `docker compose run --rm check` reaches it at 127.0.0.1 from serve's own network namespace."""
    for files in (("docker-compose.yml",), ("docker-compose.yml", "docker-compose.cpu.yml")):
        services = resolved(tmp_path, *files)["services"]
        serve, check = services["serve"], services["check"]
        assert serve["entrypoint"][-1] == "serve" and serve["command"] == ["/output/export", "--host", "0.0.0.0"]
        assert [(p["host_ip"], p["published"], p["target"]) for p in serve["ports"]] == [("127.0.0.1", "8000", 8000)]
        assert check["entrypoint"][-1] == "check" and check["network_mode"] == "service:serve"
        assert check["command"][:3] == ["http://127.0.0.1:8000/v1", "--against", "/output/export"]
        for service in (serve, check):
            assert service["profiles"] == ["serve"]
            assert "deploy" not in service or not service["deploy"].get("resources"), "no GPU needed"
