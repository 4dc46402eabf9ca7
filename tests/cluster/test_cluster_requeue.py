"""A time-limited job on the local Slurm: SIGUSR1 before the limit, checkpoint, requeue, resume (issue 18).

The generated Apptainer script runs under the real slurmctld/slurmd; only `apptainer` is a stand-in, which does
what `apptainer exec` does with the script's arguments (the binds become host paths, APPTAINERENV_NAME becomes
NAME) and runs the image's entrypoint from this tree. The trainer is the real one, training `tiny` on the CPU.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from slurm_local import PARTITION, LocalSlurm
from waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
SECRET = "hf_requeue_secret_123"

FAKE_APPTAINER = textwrap.dedent(
    """\
    #!{python}
    import os, sys
    args = sys.argv[1:]
    assert args[0] == "exec" and "--no-home" in args, args
    binds = dict(reversed(b.split(":")[:2]) for b in args[args.index("--bind") + 1].split(","))
    env = dict(os.environ)
    env.update({{k[len("APPTAINERENV_"):]: v for k, v in os.environ.items() if k.startswith("APPTAINERENV_")}})
    # the container's /output and /cache, on this host
    env.update(TRAIN_OUTPUT_DIR=binds["/output"], HF_HOME=binds["/cache"] + "/huggingface",
               PATH=os.path.dirname(sys.executable) + ":" + env["PATH"])
    entrypoint = "{root}/entrypoints/entrypoint.sh"
    os.execve(entrypoint, [entrypoint, args[-1]], env)  # args[-2] is the image's entrypoint path
    """
)


@pytest.mark.slow
def test_time_limited_job_checkpoints_requeues_and_resumes(tmp_path: Path, local_slurm: LocalSlurm) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text(
        "TRAIN_MODEL=tiny\nTRAIN_SEQ_LEN=32\nTRAIN_BATCH_SIZE=2\nTRAIN_MAX_STEPS=1000000\n"
        f"TRAIN_SAVE_STEPS=1000000\nTRAIN_LOG_STEPS=1\nHF_TOKEN={SECRET}\n"
    )
    script = tmp_path / "job.sbatch"
    output = tmp_path / "runs" / "exp1"  # does not exist yet: the script creates it
    # 5 min limit, SIGUSR1 180 s before it (Slurm may send it up to 60 s early): the first run trains 1-2 min
    subprocess.run([sys.executable, str(ROOT / "scripts" / "cluster.py"), "slurm-apptainer", "--nodes", "1",
                    "--gpus-per-node", "0", "--image", "registry.example.com/trainkit:1", "--env-file", str(env_file),
                    "--output", str(output), "--partition", PARTITION, "--time", "0:05:00", "--stop-signal-s", "180",
                    "-o", str(script)], check=True, capture_output=True, text=True)  # fmt: skip
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apptainer").write_text(FAKE_APPTAINER.format(python=sys.executable, root=ROOT))
    (bin_dir / "apptainer").chmod(0o755)
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TRAIN_", "HF_", "MASTER_"))}
    env = {**keep, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
           "SLURM_CONF": str(local_slurm.conf)}  # fmt: skip
    submitted = subprocess.run(["sbatch", "--parsable", str(script)], env=env, capture_output=True, text=True,
                               cwd=tmp_path, timeout=60)  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    log = tmp_path / f"trainkit-{job_id}.out"
    try:
        wait_for(lambda: log.exists() and "resume: continuing from" in log.read_text(), 420, "a resumed run",
                 interval=2, log=log)
        resumed_at = int(re.search(r"continuing from \S*checkpoint-(\d+)", log.read_text()).group(1))
        metrics = output / "metrics.jsonl"

        def trained_after_resume() -> bool:
            steps = [json.loads(line).get("step", 0) for line in metrics.read_text().splitlines() if line.strip()]
            return max(steps, default=0) > resumed_at

        wait_for(trained_after_resume, 180, "a step after the resume", interval=2, log=log)
    finally:
        subprocess.run(["scancel", job_id], env=env, capture_output=True, timeout=60)
        deadline = time.monotonic() + 120  # the trainer checkpoints on the way out; let it finish
        while job_id in subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True).stdout:
            if time.monotonic() > deadline:
                break
            time.sleep(2)
    text = log.read_text()
    assert "trainkit: SIGUSR1: every task checkpoints and stops" in text
    assert f"interrupted by SIGTERM: checkpoint-{resumed_at} written" in text
    assert f"requeueing job {job_id} to resume" in text
    assert text.index("requeueing job") < text.index("resume: continuing from")
    assert (output / f"checkpoint-{resumed_at}" / "trainkit_complete").exists()
    assert SECRET not in text and SECRET not in script.read_text()
