"""The launcher in the environment real sites give it (issue 18): enroot's PyTorch hook, shared first nodes, and
a stop signal on a torch whose torchrun kills workers a fixed time after SIGTERM."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from processes import gone, process_tree

ROOT = Path(__file__).resolve().parents[2]
KEEP = ("PATH", "HOME", "LANG", "TMPDIR")


def slurm_task(job_id: str, node: int, nnodes: int = 2, **extra: str) -> dict[str, str]:
    """What Slurm gives one task of `srun --ntasks-per-node=1` on an 8-GPU node."""
    return {
        "SLURM_JOB_ID": job_id, "SLURM_NNODES": str(nnodes), "SLURM_JOB_NODELIST": f"dgx[01-{nnodes:02d}]",
        "SLURM_STEP_NODELIST": f"dgx[01-{nnodes:02d}]", "SLURM_STEP_NUM_NODES": str(nnodes),
        "SLURM_STEP_NUM_TASKS": str(nnodes), "SLURM_NTASKS": str(nnodes), "SLURM_STEP_ID": "0",
        "SLURM_NODEID": str(node), "SLURM_PROCID": str(node), "SLURM_LOCALID": "0",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", **extra,
    }  # fmt: skip


def enroot_hook(task: dict[str, str]) -> dict[str, str]:
    """What enroot's 50-slurm-pytorch.sh exports into an image that sets PYTORCH_VERSION (NGC's do)."""
    return {
        "PYTORCH_VERSION": "2.7.0a0+7c8ec84dab", "MASTER_ADDR": "dgx01",
        "MASTER_PORT": str(6000 + int(task["SLURM_JOB_ID"]) % 10000), "WORLD_SIZE": task["SLURM_NTASKS"],
        "RANK": task["SLURM_PROCID"], "LOCAL_RANK": task["SLURM_LOCALID"],
    }  # fmt: skip


def dry_run(env: dict[str, str], tmp_path: Path) -> dict:
    base = {k: os.environ[k] for k in KEEP if k in os.environ}
    full = {**base, "PYTHONPATH": str(ROOT), "TRAIN_OUTPUT_DIR": str(tmp_path), **env}
    done = subprocess.run([sys.executable, "-m", "trainer.launch", "--dry-run", "--json", "train"], env=full,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def torchrun_options(decision: dict) -> dict[str, str | None]:
    """torchrun's options (flags map to None) from a decided command."""
    cmd = decision["command"]
    words = cmd[cmd.index("torch.distributed.run") + 1 : cmd.index("-m", cmd.index("torch.distributed.run"))]
    opts: dict[str, str | None] = {}
    while words:
        word = words.pop(0)
        opts[word] = words.pop(0) if words and not words[0].startswith("--") else None
    return opts


def test_enroot_hook_variables_plus_slurm_start_8_processes_per_node(tmp_path: Path) -> None:
    decisions = []
    for node in range(2):
        task = slurm_task("731942", node)
        decisions.append(dry_run({**task, **enroot_hook(task)}, tmp_path))
    for node, decision in enumerate(decisions):
        assert decision["distributed"], decision  # before: "already a torchrun worker", one process on 8 GPUs
        assert decision["supervised"]  # the launcher stays torchrun's parent and delivers stops
        opts = torchrun_options(decision)
        assert opts["--nproc-per-node"] == "8" and opts["--nnodes"] == "2"
        assert opts["--rdzv-endpoint"] == "dgx01:21942"  # 20000 + 731942 % 10000, not the hook's MASTER_PORT
        assert decision["placement"]["node_rank"] == node
        assert decision["cleared"] == ["LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]


def test_hook_variables_do_not_reach_torchrun_or_a_single_process(tmp_path: Path) -> None:
    script = "import os; print({k: os.environ.get(k) for k in ('LOCAL_RANK', 'RANK', 'WORLD_SIZE', 'MASTER_PORT')})"
    task = slurm_task("55", 0, nnodes=1, CUDA_VISIBLE_DEVICES="0")
    env = {k: os.environ[k] for k in KEEP if k in os.environ}
    env.update(PYTHONPATH=str(ROOT), TRAIN_OUTPUT_DIR=str(tmp_path), **task, **enroot_hook(task))
    # the launcher's own exec: run its decision's environment through a probe instead of the trainer
    probe = textwrap.dedent(f"""
        import os, sys
        from trainer.launch.decide import decide
        d = decide("train", [], os.environ)
        os.execve(sys.executable, [sys.executable, "-c", {script!r}], d.env)
    """)
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(dict.fromkeys(("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_PORT")))


def test_two_jobs_on_one_first_node_get_different_ports(tmp_path: Path) -> None:
    ports = {torchrun_options(dry_run(slurm_task(job, 0), tmp_path))["--rdzv-endpoint"] for job in ("4100", "4101")}
    assert ports == {"dgx01:24100", "dgx01:24101"}


def test_inside_torchrun_means_torchelastic_run_id_only(tmp_path: Path) -> None:
    worker = dry_run({"TORCHELASTIC_RUN_ID": "x", "LOCAL_RANK": "3", "TRAIN_NPROC_PER_NODE": "2"}, tmp_path)
    assert not worker["distributed"] and worker["placement"]["source"] == "already a torchrun worker"
    assert not worker["supervised"]  # a worker execs the trainer: torchrun is its parent
    hook_only = dry_run({"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1", "TRAIN_NPROC_PER_NODE": "2"}, tmp_path)
    assert hook_only["distributed"] and torchrun_options(hook_only)["--nproc-per-node"] == "2"


# A torchrun worker whose "checkpoint" takes SAVE_S seconds after SIGTERM (a comma-separated list: one per rank); it
# records its start, each stop signal and its save, and exits as the trainer does.
SLOW_SAVER = """\
import os, signal, sys, time
from pathlib import Path
from trainer.errors import record_outcome  # as the trainer does: the launcher tells a stop from a crash by it
marks, rank = Path(os.environ["MARK_DIR"]), os.environ["RANK"]
with open(marks / f"start-{rank}", "a") as fh:
    fh.write("started\\n")
def save_and_stop(signum, frame):
    with open(marks / f"stops-{rank}", "a") as fh:
        fh.write(f"{signum}\\n")
    time.sleep(float(os.environ["SAVE_S"].split(",")[int(rank)]))
    (marks / f"saved-{rank}").write_text("saved")
    sys.exit(record_outcome(128 + signum))
signal.signal(signal.SIGTERM, save_and_stop)
(marks / f"ready-{rank}").write_text("")
while True:
    time.sleep(0.1)
"""

DRIVER = """\
import os, sys
from trainer.launch.decide import LaunchPlan
from trainer.launch.placement import Placement
from trainer.launch.supervise import supervise
command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node", "2",
           "--max-restarts", "3", sys.argv[1]]
decision = LaunchPlan(Placement("test"), 2, "", 3, command, dict(os.environ), True, supervised=True)
sys.exit(supervise(decision))
"""


def slurm_step_signal(proc: subprocess.Popen, sig: signal.Signals) -> None:
    """What `scancel --signal` does: slurmstepd signals every process of the step."""
    for pid in process_tree(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def dumb_init_signal(proc: subprocess.Popen, sig: signal.Signals) -> None:
    """What dumb-init (the image's PID 1) does on docker stop / pod deletion: signal the child's process group."""
    os.killpg(proc.pid, sig)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("deliver", "stop"),
    [(slurm_step_signal, signal.SIGUSR1), (dumb_init_signal, signal.SIGTERM), (dumb_init_signal, signal.SIGUSR1)],
)
def test_stop_reaches_the_workers_with_the_time_the_scheduler_gives(tmp_path: Path, deliver, stop) -> None:
    """torch < 2.12 gives workers a fixed 30 s after torchrun's own SIGTERM; TORCH_ELASTIC_SHUTDOWN_TIMEOUT=1 plays that
    fixed wait here (this torch honours the variable), against a checkpoint that takes 5 s. The signal arrives the
    way each site sends it: to every process of a Slurm step, or to the process group under dumb-init. Rank 0 ends
    4 s before rank 1: torchrun restarts the group when the first worker exits non-zero, and kills rank 1's save."""
    (tmp_path / "worker.py").write_text(SLOW_SAVER)
    (tmp_path / "driver.py").write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MARK_DIR": str(tmp_path), "SAVE_S": "1,5",
           "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "1"}  # fmt: skip
    proc = subprocess.Popen([sys.executable, "driver.py", "worker.py"], cwd=tmp_path, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("ready-*"))) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.2)
        deliver(proc, stop)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, out
    assert sorted(p.name for p in tmp_path.glob("saved-*")) == ["saved-0", "saved-1"], out
    # torchrun did not restart the workers that stopped, nor stop rank 1 for rank 0's exit (a second SIGTERM)
    assert all(p.read_text() == "started\n" for p in tmp_path.glob("start-*")), out
    assert [p.read_text() for p in sorted(tmp_path.glob("stops-*"))] == [f"{int(signal.SIGTERM)}\n"] * 2, out


SLEEPER_DRIVER = """\
import os, sys
from trainer.launch.decide import LaunchPlan
from trainer.launch.placement import Placement
from trainer.launch.supervise import supervise
code = "import os, time; open('child.pid', 'w').write(str(os.getpid())); time.sleep(120)"
plan = LaunchPlan(Placement("test"), 1, "", 0, [sys.executable, "-c", code], dict(os.environ), False, supervised=True)
sys.exit(supervise(plan))
"""


@pytest.mark.parametrize("victim", ["launcher", "trainer"])
def test_launcher_and_trainer_share_their_fate(tmp_path: Path, victim: str) -> None:
    """SIGKILL to the launcher takes the trainer with it (no orphan holding GPUs); a trainer killed by the OOM
    killer's SIGKILL makes the launcher end the same way, so its caller sees the signal."""
    (tmp_path / "driver.py").write_text(SLEEPER_DRIVER)
    proc = subprocess.Popen([sys.executable, "driver.py"], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "child.pid").exists() or not (tmp_path / "child.pid").read_text():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        child = int((tmp_path / "child.pid").read_text())
        os.kill(proc.pid if victim == "launcher" else child, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while not gone(child):
            assert time.monotonic() < deadline, "the trainer outlived the launcher"
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
