"""Rules with one definition (issue 11): the secret rule, the .env parser, TRAIN_* validation, processes per node.

Each test is one of the disagreements the copies had: run.py hid /models/monkey, cluster.py put
TOKENIZERS_PARALLELISM into a Kubernetes Secret, the sbatch's bash loader read `KEY = value`, inline comments
and CRLF differently from Python, cluster.py failed a valid .env when the host exported a bad TRAIN_*, and the
trainer and the launcher each had their own processes-per-node rule.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainer.config import parse_settings
from trainer.config.launch import decide_nproc
from trainer.envfile import read_env_file
from trainer.errors import ConfigError
from trainer.machine.hardware import Hardware
from trainer.secrets import is_secret_name, mask_args, mask_secrets

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "scripts" / "cluster.py"
IMAGE = "registry.example.com/trainkit:0.1.0-cu128-ngc25.03"
# One .env with every shape the old parsers disagreed on: spaces around '=', inline comments, CRLF, quotes, export.
TRICKY_ENV = (
    "TRAIN_MODEL = tiny\r\n"
    "TRAIN_SAVE_STEPS=50  # often\r\n"
    "TOKENIZERS_PARALLELISM=false\n"
    "TRAIN_DATA=/models/monkey\n"
    'export HF_TOKEN = "hf_abcdefgh1234 # not a comment"  # a comment\r\n'
    "WANDB_API_KEY='a b$c'\n"
)
EXPECTED = {
    "TRAIN_MODEL": "tiny",
    "TRAIN_SAVE_STEPS": "50",
    "TOKENIZERS_PARALLELISM": "false",
    "TRAIN_DATA": "/models/monkey",
    "HF_TOKEN": "hf_abcdefgh1234 # not a comment",
    "WANDB_API_KEY": "a b$c",
}


def run_cluster(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CLUSTER), *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, timeout=60)  # fmt: skip


def test_the_secret_rule_and_its_exceptions() -> None:
    for name in ("HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "--hub-token", "--hub_token=x"):
        assert is_secret_name(name), name
    for name in ("TOKENIZERS_PARALLELISM", "--average_tokens_across_devices", "TRAIN_DATA", "TRAIN_MODEL",
                 "TRAIN_RL_MAX_NEW_TOKENS", "--max_new_tokens"):  # fmt: skip
        assert not is_secret_name(name), name
    assert mask_args(["--hub_token", "abc", "--lr", "1", "--hub-token=xyz", "hf_abcdefgh1234"]) == [
        "--hub_token", "***", "--lr", "1", "--hub-token=***", "***"
    ]  # fmt: skip
    mirror = {"HF_ENDPOINT": "https://user:pa55@mirror.example/hf", "TRAIN_DATA": "hf://datasets/org/name@v1/en"}
    assert mask_secrets(mirror) == {"HF_ENDPOINT": "https://***@mirror.example/hf", "TRAIN_DATA": mirror["TRAIN_DATA"]}
    assert mask_args(["--endpoint", "http://u:p@h/x"]) == ["--endpoint", "http://***@h/x"]
    # by what the value is (issue 59): a record's field or a library named like a secret word keeps its number or
    # version; a credential-shaped value under a secret name is masked, whatever its characters
    record = {"rl_max_new_tokens": 6, "tokenizers": "0.22.1", "torch": "2.13.0+cpu", "tokenizer": "/models/tok",
              "HF_TOKEN": "12345678", "api_key": "0.5abc", "--hub_token": ""}  # fmt: skip
    assert mask_secrets(record) == {**record, "HF_TOKEN": "***", "api_key": "***"}


def test_run_py_shows_values_that_merely_contain_a_secret_word() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from run import describe_env
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    env = {"TRAIN_DATA": "/models/monkey", "HF_TOKEN": "hf_abcdefgh1234",
           "TRAIN_ARGS": "--hub_token abc --warmup_steps 5", "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    shown = describe_env(env)
    assert "TRAIN_DATA=/models/monkey" in shown  # the old run.py hid any value containing KEY
    assert "TOKENIZERS_PARALLELISM=false" in shown
    assert "HF_TOKEN=***" in shown and "hf_abcdefgh1234" not in shown
    assert "TRAIN_ARGS=--hub_token *** --warmup_steps 5" in shown
    assert mask_secrets({"TRAIN_DATA": "/models/monkey"}) == {"TRAIN_DATA": "/models/monkey"}


def test_one_parser_reads_the_tricky_env(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text(TRICKY_ENV)
    assert read_env_file(env_file) == EXPECTED


def test_slurm_job_gets_the_values_the_parser_read(tmp_path: Path) -> None:
    """The job file's settings and its secrets file, read back by bash as the job does, give the parser's values."""
    env_file = tmp_path / ".env"
    env_file.write_text(TRICKY_ENV)
    job = tmp_path / "job.sbatch"
    done = run_cluster("slurm-pyxis", "--image", IMAGE, "--env-file", str(env_file), "--output", str(tmp_path / "o"),
                       "-o", str(job))  # fmt: skip
    assert done.returncode == 0, done.stderr
    text = job.read_text()
    assert "hf_abcdefgh1234" not in text and "a b$c" not in text
    # run the job's variable part (everything before srun) and print what it exported
    head = text.split("\nsrun ", 1)[0].split("\nset -euo pipefail", 1)[1]
    names = " ".join(EXPECTED)
    dump = f'import json, os; print(json.dumps({{n: os.environ.get(n) for n in "{names}".split()}}))'
    probe = f"{head}\npython3 -c {shlex.quote(dump)}"
    shell = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
    assert shell.returncode == 0, shell.stderr
    assert json.loads(shell.stdout.splitlines()[-1]) == EXPECTED


def test_tokenizers_parallelism_is_a_value_not_a_secret_ref(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text(TRICKY_ENV)
    job = tmp_path / "job.yaml"
    done = run_cluster("k8s", "--image", IMAGE, "--env-file", str(env_file), "--output-pvc", "runs", "-o", str(job))
    assert done.returncode == 0, done.stderr
    manifest = yaml.safe_load(job.read_text())
    env = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"]
    by_name = {item["name"]: item for item in env}
    assert by_name["TOKENIZERS_PARALLELISM"] == {"name": "TOKENIZERS_PARALLELISM", "value": "false"}
    assert "HF_TOKEN" not in by_name and by_name["HF_TOKEN_PATH"]["value"].endswith("/HF_TOKEN")  # a file
    assert "WANDB_API_KEY" in by_name and "value" not in by_name["WANDB_API_KEY"]
    assert "kubectl create secret generic trainkit-secrets" in job.read_text()
    assert "TOKENIZERS_PARALLELISM" not in job.read_text().split("kubectl create secret")[1].splitlines()[0]


def test_host_train_variables_do_not_reach_the_env_check(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("TRAIN_MODEL=tiny\n")
    args = ("k8s", "--image", IMAGE, "--env-file", str(env_file), "--output-pvc", "runs")
    done = run_cluster(*args, env={"TRAIN_PRECISION": "garbage", "TRAIN_BATCHSIZE": "3"})
    assert done.returncode == 0, done.stderr
    env_file.write_text("TRAIN_PRECISION=garbage\n")  # the same value in the .env is the user's mistake
    done = run_cluster(*args)
    assert done.returncode == 2 and "TRAIN_PRECISION='garbage'" in done.stderr and "Traceback" not in done.stderr


def test_cluster_validation_is_the_trainers(tmp_path: Path) -> None:
    """The same .env gets the same message from cluster.py as from the trainer's own parse."""
    env_file = tmp_path / ".env"
    env_file.write_text("TRAIN_BATCHSIZE=4\nTRAIN_LR=-1\n")
    with pytest.raises(ConfigError) as info:
        parse_settings(read_env_file(env_file))
    done = run_cluster("k8s", "--image", IMAGE, "--env-file", str(env_file), "--output-pvc", "runs")
    assert done.returncode == 2
    for line in info.value.problems:
        assert line in done.stderr


@pytest.mark.parametrize(("requested", "gpus", "expected"), [("auto", 8, 8), ("auto", 0, 1), ("2", 8, 2), ("3", 0, 3)])
def test_trainer_and_launcher_count_processes_alike(requested: str, gpus: int, expected: int) -> None:
    settings = parse_settings({"TRAIN_NPROC_PER_NODE": requested})
    hardware = Hardware(device="cuda" if gpus else "cpu", gpu_count=gpus)
    assert decide_nproc(settings, hardware).value == expected
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRAIN_NPROC_PER_NODE": requested,
           "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(gpus))}  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "trainer.launch", "--dry-run", "--json"], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["nproc_per_node"] == expected


def test_trainer_and_launcher_refuse_too_many_processes_alike() -> None:
    with pytest.raises(ConfigError) as info:
        decide_nproc(parse_settings({"TRAIN_NPROC_PER_NODE": "4"}), Hardware(device="cuda", gpu_count=2))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRAIN_NPROC_PER_NODE": "4", "CUDA_VISIBLE_DEVICES": "0,1"}
    done = subprocess.run([sys.executable, "-m", "trainer.launch", "--dry-run"], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2
    for text in (info.value.message, done.stderr):
        assert "TRAIN_NPROC_PER_NODE=4 but only 2 GPU(s) are visible" in text
