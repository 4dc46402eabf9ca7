"""The launcher's decision for each family of scheduler variables, through its dry run as a subprocess.

The Kubeflow environments below are what training-operator v1.9 (pkg/controller.v1/pytorch/envvar.go,
master.go, elastic.go) sets on a PyTorchJob's pods.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from processes import gone, process_tree

ROOT = Path(__file__).resolve().parents[2]
SCHEDULER_PREFIXES = ("SLURM_", "PET_", "TRAIN_", "TORCHELASTIC_", "CUDA_")
SCHEDULER_NAMES = {"NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "RDZV_ENDPOINT", "RDZV_ID",
                   "RDZV_BACKEND", "WORLD_SIZE", "RANK", "LOCAL_RANK"}  # fmt: skip


OUTPUT = Path("/nonexistent")  # set per module below: the launcher checks that the output folder is writable


@pytest.fixture(autouse=True, scope="module")
def _writable_output(tmp_path_factory: pytest.TempPathFactory) -> None:
    global OUTPUT
    OUTPUT = tmp_path_factory.mktemp("output")


def clean_env(**env: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(SCHEDULER_PREFIXES) and k not in SCHEDULER_NAMES}
    # No GPU on this machine; an explicit empty list also keeps nvidia-smi out of the decision.
    return {**base, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT), "TRAIN_OUTPUT_DIR": str(OUTPUT), **env}


def launch(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer.launch", *args], env=clean_env(**env), cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def decide(*args: str, **env: str) -> dict:
    done = launch("--dry-run", "--json", *args, **env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def torchrun_options(decision: dict) -> dict[str, str | None]:
    """torchrun's options (flags map to None) from a decided command."""
    cmd = decision["command"]
    assert cmd[1:3] == ["-m", "torch.distributed.run"], cmd
    opts: dict[str, str | None] = {}
    words = cmd[3 : cmd.index("-m", 3)]
    while words:
        word = words.pop(0)
        opts[word] = words.pop(0) if words and not words[0].startswith("--") else None
    return opts


def test_single_process_runs_the_trainer_directly() -> None:
    decision = decide("train", "--some-flag")
    assert not decision["distributed"]
    assert decision["command"][1:] == ["-m", "trainer", "train", "--some-flag"]
    assert "CPU" in decision["nproc_reason"]


def test_cpu_processes_from_train_nproc_per_node() -> None:
    decision = decide(TRAIN_NPROC_PER_NODE="2")
    opts = torchrun_options(decision)
    assert "--standalone" in opts and opts["--nnodes"] == "1" and opts["--nproc-per-node"] == "2"
    assert opts["--max-restarts"] == "3" and opts["--tee"] == "3"
    assert decision["command"][-3:] == ["-m", "trainer", "train"]
    assert decision["env"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert decision["env"]["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] == "[rank${rank}]:"


def test_the_workers_share_the_cores_and_wait_passively() -> None:
    """trainer/machine/threads.py for the processes the launcher starts: the node's cores shared among them (torchrun
    would give each one thread), OpenMP's waiting threads asleep, the decision's line passed on for rank 0 to log."""
    if {"OMP_NUM_THREADS", "OMP_WAIT_POLICY"} & set(os.environ):
        pytest.skip("the caller set OMP_NUM_THREADS or OMP_WAIT_POLICY: the launcher keeps theirs")
    env = decide(TRAIN_NPROC_PER_NODE="2")["env"]
    cores = len(os.sched_getaffinity(0))
    assert (env["OMP_NUM_THREADS"], env["OMP_WAIT_POLICY"]) == (str(max(1, cores // 2)), "PASSIVE"), env
    assert env["TRAINKIT_THREADS"].startswith(f"threads: {max(1, cores // 2)} per process ({cores} usable cores")
    assert "shared by 2 processes" in env["TRAINKIT_THREADS"]
    assert "OMP_NUM_THREADS" not in decide()["env"]  # one process: the trainer decides for itself


def test_one_process_per_visible_gpu() -> None:
    decision = decide(CUDA_VISIBLE_DEVICES="0,1,2,3")
    assert torchrun_options(decision)["--nproc-per-node"] == "4"
    assert "CUDA_VISIBLE_DEVICES" in decision["nproc_reason"]
    done = launch("--dry-run", CUDA_VISIBLE_DEVICES="0,1", TRAIN_NPROC_PER_NODE="8")
    assert done.returncode == 2 and "only 2 GPU(s)" in done.stderr and "Traceback" not in done.stderr


def test_torchrun_variables_c10d() -> None:
    decision = decide(NNODES="2", NODE_RANK="1", RDZV_ENDPOINT="node0", RDZV_ID="exp7", TRAIN_MAX_RESTARTS="0")
    opts = torchrun_options(decision)
    assert opts["--nnodes"] == "2" and opts["--nproc-per-node"] == "1"
    assert opts["--rdzv-backend"] == "c10d" and opts["--rdzv-endpoint"] == "node0:29400" and opts["--rdzv-id"] == "exp7"
    assert opts["--max-restarts"] == "0"
    assert opts["--rdzv-conf"] == "join_timeout=600,read_timeout=60"
    assert decision["placement"]["node_rank"] == 1


def test_torchrun_master_addr_and_static_rendezvous() -> None:
    opts = torchrun_options(decide(NNODES="4", MASTER_ADDR="10.0.0.1", MASTER_PORT="1234", TRAIN_RDZV_TIMEOUT="90"))
    assert opts["--rdzv-endpoint"] == "10.0.0.1:1234" and opts["--rdzv-conf"] == "join_timeout=90,read_timeout=60"
    opts = torchrun_options(decide(NNODES="2", NODE_RANK="1", MASTER_ADDR="h0", RDZV_BACKEND="static"))
    assert opts["--node-rank"] == "1" and opts["--master-addr"] == "h0" and opts["--master-port"] == "29500"
    assert "--rdzv-endpoint" not in opts


def test_slurm_multi_node() -> None:
    slurm = {"SLURM_JOB_ID": "77", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "gpu[003-004]", "SLURM_NODEID": "1",
             "SLURM_PROCID": "1", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2"}  # fmt: skip
    decision = decide(**slurm, CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7")
    opts = torchrun_options(decision)
    assert opts["--nnodes"] == "2" and opts["--nproc-per-node"] == "8"
    assert opts["--rdzv-endpoint"] == "gpu003:20077" and opts["--rdzv-id"] == "77"  # port 20000 + job ID % 10000
    assert decision["placement"] == {**decision["placement"], "source": "Slurm", "node_rank": 1}
    # a step on part of the allocation: the step's nodes count, not the job's
    step = {**slurm, "SLURM_NNODES": "8", "SLURM_STEP_NUM_NODES": "3", "SLURM_STEP_NUM_TASKS": "3",
            "SLURM_STEP_NODELIST": "gpu-b[10-11],gpu-a1"}  # fmt: skip
    opts = torchrun_options(decide(**step))
    assert opts["--nnodes"] == "3" and opts["--rdzv-endpoint"] == "gpu-b10:20077"


def test_slurm_single_node_and_mistakes() -> None:
    opts = torchrun_options(
        decide(SLURM_JOB_ID="5", SLURM_NNODES="1", SLURM_JOB_NODELIST="n1", CUDA_VISIBLE_DEVICES="0,1")
    )
    assert "--standalone" in opts and opts["--nproc-per-node"] == "2"
    base = {"SLURM_JOB_ID": "5", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "n[1-2]"}
    per_gpu = launch("--dry-run", **base, SLURM_STEP_ID="0", SLURM_PROCID="3", SLURM_STEP_NUM_TASKS="16")
    assert per_gpu.returncode == 2 and "one task per node" in per_gpu.stderr
    no_srun = launch("--dry-run", **base)
    assert no_srun.returncode == 2 and "srun" in no_srun.stderr
    bad_list = launch("--dry-run", **{**base, "SLURM_JOB_NODELIST": "n[2-1]"}, SLURM_STEP_ID="0", SLURM_PROCID="0")
    assert bad_list.returncode == 2 and "SLURM_JOB_NODELIST" in bad_list.stderr


def kubeflow_pod_env(rank: int, job: str = "llm", pods: int = 2, nproc: str = "8") -> dict[str, str]:
    """What training-operator v1.9 sets on pod `rank` of a Master + Worker PyTorchJob with nprocPerNode."""
    return {
        "PYTHONUNBUFFERED": "1",
        "MASTER_PORT": "29400",
        "PET_MASTER_PORT": "29400",
        "MASTER_ADDR": f"{job}-master-0",
        "PET_MASTER_ADDR": f"{job}-master-0",
        "WORLD_SIZE": str(pods * int(nproc)),
        "RANK": str(rank),
        "PET_NODE_RANK": str(rank),
        "PET_NPROC_PER_NODE": nproc,
        "PET_NNODES": str(pods),
    }


def test_kubeflow_pytorchjob() -> None:
    for rank in (0, 1):
        decision = decide(**kubeflow_pod_env(rank))
        opts = torchrun_options(decision)
        assert opts["--nnodes"] == "2" and opts["--nproc-per-node"] == "8"
        assert opts["--rdzv-endpoint"] == "llm-master-0:29400" and opts["--rdzv-id"] == "llm-master-0"
        assert decision["placement"]["node_rank"] == rank
    # TRAIN_NPROC_PER_NODE (the user's .env) wins over the job's nprocPerNode
    assert torchrun_options(decide(**kubeflow_pod_env(0), TRAIN_NPROC_PER_NODE="2"))["--nproc-per-node"] == "2"


def test_kubeflow_elastic_policy() -> None:
    env = {**kubeflow_pod_env(1), "PET_NNODES": "1:4", "PET_RDZV_ENDPOINT": "llm-worker-0:29400",
           "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ID": "llm", "PET_MAX_RESTARTS": "5",
           "PET_RDZV_CONF": "join_timeout=900,last_call_timeout=10"}  # fmt: skip
    opts = torchrun_options(decide(**env))
    assert opts["--nnodes"] == "1:4" and opts["--rdzv-endpoint"] == "llm-worker-0:29400"
    assert opts["--rdzv-id"] == "llm" and opts["--max-restarts"] == "5"
    assert opts["--rdzv-conf"] == "join_timeout=900,read_timeout=60,last_call_timeout=10"
    assert torchrun_options(decide(**env, TRAIN_MAX_RESTARTS="1"))["--max-restarts"] == "1"


def test_older_kubeflow_world_size_and_rank() -> None:
    decision = decide(WORLD_SIZE="3", RANK="2", MASTER_ADDR="job-master-0", MASTER_PORT="23456")
    opts = torchrun_options(decision)
    assert opts["--nnodes"] == "3" and opts["--rdzv-endpoint"] == "job-master-0:23456"
    assert decision["placement"]["node_rank"] == 2


def test_no_nested_torchrun_and_other_commands_run_once() -> None:
    inside = decide(NNODES="2", RDZV_ENDPOINT="h:1", LOCAL_RANK="0", TORCHELASTIC_RUN_ID="x")
    assert not inside["distributed"] and inside["command"][1:] == ["-m", "trainer", "train"]
    doctor = decide("doctor", "--json", NNODES="2", RDZV_ENDPOINT="h:1")
    assert not doctor["distributed"] and doctor["command"][1:] == ["-m", "trainer", "doctor", "--json"]


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"NNODES": "2"}, "RDZV_ENDPOINT"),
        ({"NNODES": "two", "RDZV_ENDPOINT": "h"}, "NNODES='two'"),
        ({"TRAIN_NPROC_PER_NODE": "lots"}, "TRAIN_NPROC_PER_NODE"),
        ({"TRAIN_LR": "-1"}, "TRAIN_LR"),  # one process: the trainer's own check
        ({"TRAIN_LR": "-1", "TRAIN_NPROC_PER_NODE": "2"}, "TRAIN_LR"),  # before torchrun: checked once per node
        ({"TRAIN_MAX_RESTARTS": "-1", "TRAIN_NPROC_PER_NODE": "2"}, "TRAIN_MAX_RESTARTS"),
        ({"TRAIN_BATCHSIZE": "4", "NNODES": "2", "RDZV_ENDPOINT": "h"}, "TRAIN_BATCHSIZE"),
        ({"TRAIN_DATA": "/no/such/corpus.jsonl", "NNODES": "2", "RDZV_ENDPOINT": "h"}, "/no/such/corpus.jsonl"),
        ({"NNODES": "2", "RDZV_BACKEND": "static", "MASTER_ADDR": "h"}, "NODE_RANK"),
    ],
)
def test_mistakes_exit_2_with_one_message(env: dict[str, str], needle: str) -> None:
    done = launch("train", **env)  # not a dry run: nothing may start
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and needle in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "torch.distributed.run" not in done.stderr  # stopped before any worker


def test_launch_line_is_printed_without_secrets() -> None:
    done = launch("--dry-run", "train", "--hub_token=hf_secret1", "--api-key", "sk-secret2", TRAIN_NPROC_PER_NODE="2")
    assert done.returncode == 0
    assert "trainkit launch: " in done.stderr and "torch.distributed.run" in done.stderr
    assert "hf_secret1" not in done.stderr + done.stdout and "sk-secret2" not in done.stderr
    assert "--hub_token=***" in done.stderr


def start_two_ranks(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """The launcher of a real torchrun with two CPU workers, once rank 0 has logged two steps; its output (a file, not
    a pipe: a full pipe nobody reads would hold the launcher up) and the run's outputs are under tmp_path."""
    # More steps than the run reaches: on a loaded machine 500 steps ended before the test saw two metrics lines.
    env = clean_env(TRAIN_NPROC_PER_NODE="2", TRAIN_MODEL="tiny", TRAIN_SEQ_LEN="32", TRAIN_BATCH_SIZE="2",
                    TRAIN_MAX_STEPS="1000000", TRAIN_SAVE_STEPS="1000000", TRAIN_LOG_STEPS="1",
                    TRAIN_OUTPUT_DIR=str(tmp_path / "output"))  # fmt: skip
    log = tmp_path / "launcher.log"
    with open(log, "w") as out_file:
        proc = subprocess.Popen([sys.executable, "-m", "trainer.launch", "train"], env=env, cwd=ROOT,
                                stdout=out_file, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    deadline = time.monotonic() + 300
    metrics = tmp_path / "output" / "metrics.jsonl"
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        if proc.poll() is not None or time.monotonic() > deadline:
            kill_run(proc)
            pytest.fail("the run did not log two steps:\n" + log.read_text()[-3000:])
        time.sleep(0.5)
    return proc, log


def kill_run(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher and everything it started (a failed test leaves no trainer behind)."""
    for pid in process_tree(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.slow
def test_sigterm_reaches_torchrun_workers_and_the_launcher_exits_143(tmp_path: Path) -> None:
    """A real torchrun with two CPU workers: SIGTERM to the launcher -> every rank stops at the same step,
    rank 0 writes a checkpoint, torchrun does not restart them, the launcher exits 143 within a bounded time."""
    proc, log = start_two_ranks(tmp_path)
    try:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            pytest.fail("no exit 180 s after SIGTERM:\n" + log.read_text()[-5000:])
    finally:
        if proc.poll() is None:
            kill_run(proc)
    out = log.read_text()
    assert proc.returncode == 143, out[-3000:]
    assert "[rank0]:" in out and "[rank1]:" in out
    assert out.count("rank 0 writes metrics") == 1, out[-3000:]  # torchrun did not restart the workers that stopped
    checkpoints = [p for p in (tmp_path / "output").glob("checkpoint-*") if (p / "trainkit_complete").exists()]
    assert checkpoints, out[-3000:]


@pytest.mark.slow
def test_sigkill_to_the_launcher_leaves_no_worker_behind(tmp_path: Path) -> None:
    """SIGKILL to the launcher: torchrun dies with it, and its workers with torchrun (each asked for it), so no
    trainer keeps the GPUs or the output lock; their data loader workers follow within PyTorch's 5 s check."""
    proc, log = start_two_ranks(tmp_path)
    run = [pid for pid in process_tree(proc.pid) if pid != proc.pid]
    try:
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 30
        while not all(gone(pid) for pid in run):
            left = [pid for pid in run if not gone(pid)]
            assert time.monotonic() < deadline, f"still running 30 s after the launcher's SIGKILL: {left}\n" + (
                log.read_text()[-2000:])
            time.sleep(0.2)
    finally:
        for pid in run:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
