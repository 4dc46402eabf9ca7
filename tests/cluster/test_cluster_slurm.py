"""Generated Slurm batch scripts (pyxis/enroot and Apptainer).

srun, pyxis and apptainer cannot run here: stand-ins on PATH record their arguments and then do what the
container would do first, the launcher's decision (`python -m trainer.launch --dry-run --json train`),
once per node with the variables Slurm gives each task. Where a local slurmctld/slurmd can start, the
scripts also go through the real `sbatch --test-only`, and the Apptainer one through a real `sbatch` + `srun`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from slurm_local import PARTITION, LocalSlurm

ROOT = Path(__file__).resolve().parents[2]
SECRET = "hf_do_not_leak_1234"
IMAGE = "registry.example.com/team/trainkit:0.1.0-cu128-ngc25.03"

# Stand-in for `srun` (and, in the real-Slurm test, `apptainer`): record argv and the job's environment,
# then take the decision the container's launcher would take on every node.
FAKE_TOOL = textwrap.dedent(
    """\
    #!{python}
    import json, os, subprocess, sys
    from pathlib import Path

    args = sys.argv[1:]
    kept = ("TRAIN_", "MASTER_", "HF_", "SLURM_", "CUDA_", "APPTAINERENV_", "PYTHON")
    record = {{"argv": args, "env": {{k: v for k, v in os.environ.items() if k.startswith(kept)}}}}
    fake_nodes = "SLURM_NODEID" not in os.environ  # plain `bash job.sh`: no Slurm to start the tasks
    nodes = range(int(os.environ["SLURM_NNODES"])) if fake_nodes else [int(os.environ["SLURM_NODEID"])]
    record["decisions"] = []
    for node in nodes:
        env = dict(os.environ, TRAIN_OUTPUT_DIR=os.environ["FAKE_RECORD_DIR"])  # the container's /output mount
        if fake_nodes:
            env.update(SLURM_NODEID=str(node), SLURM_PROCID=str(node), SLURM_STEP_ID="0",
                       SLURM_STEP_NUM_NODES=env["SLURM_NNODES"], SLURM_STEP_NUM_TASKS=env["SLURM_NNODES"],
                       SLURM_STEP_NODELIST=env["SLURM_JOB_NODELIST"], CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7")
        out = subprocess.run([sys.executable, "-m", "trainer.launch", "--dry-run", "--json", args[-1]],
                             env=env, capture_output=True, text=True)
        if out.returncode:
            sys.exit(out.stderr)
        record["decisions"].append(json.loads(out.stdout))
    name = Path(sys.argv[0]).name + "-" + os.environ.get("SLURM_NODEID", "all") + ".json"
    Path(os.environ["FAKE_RECORD_DIR"], name).write_text(json.dumps(record))
    """
)


def generate(tmp_path: Path, target: str, *extra: str) -> Path:
    env_file = tmp_path / ".env"
    env_file.write_text(
        "# user settings\nTRAIN_MODEL=tiny\nTRAIN_ARGS='--warmup_steps 5 --weight_decay 0.1'\n"
        f'export HF_TOKEN="{SECRET}"\nTRAIN_SAVE_STEPS=50  # often\n'
    )
    (tmp_path / "data").mkdir(exist_ok=True)
    out = tmp_path / f"{target}.sbatch"
    cmd = [sys.executable, str(ROOT / "scripts" / "cluster.py"), target, "--env-file", str(env_file),
           "--data", str(tmp_path / "data"), "--output", str(tmp_path / "out"), "-o", str(out), *extra]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


def fake_bin(tmp_path: Path, *tools: str) -> Path:
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    for tool in tools:
        path = bin_dir / tool
        path.write_text(FAKE_TOOL.format(python=sys.executable))
        path.chmod(0o755)
    return bin_dir


def job_env(tmp_path: Path, bin_dir: Path, **slurm: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TRAIN_", "HF_", "MASTER_"))}
    return {**keep, **slurm, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
            "FAKE_RECORD_DIR": str(tmp_path)}  # fmt: skip


@pytest.mark.parametrize("target", ["slurm-pyxis", "slurm-apptainer"])
def test_scripts_pass_bash_n_and_keep_secrets_out(tmp_path: Path, target: str) -> None:
    script = generate(tmp_path, target, "--nodes", "4", "--image", IMAGE, "--partition", "gpu", "--time", "2:00:00")
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert SECRET not in text
    for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --partition=gpu", "#SBATCH --time=2:00:00", "#SBATCH --signal=B:USR1@300",
                 "#SBATCH --requeue", "#SBATCH --open-mode=append", "#SBATCH --exclusive",
                 "#SBATCH --mem=0"):  # fmt: skip
        assert line in text.splitlines()


def run_with_fake_srun(tmp_path: Path, script: Path, *tools: str) -> dict:
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_NNODES": "3", "SLURM_JOB_NODELIST": "gpu-a[07-08],gpu-b3",
             "SLURM_CPUS_ON_NODE": "64"}  # fmt: skip
    env = job_env(tmp_path, fake_bin(tmp_path, *tools), **slurm)
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads((tmp_path / "srun-all.json").read_text())


def assert_rendezvous(decisions: list[dict], nnodes: int, endpoint: str, rdzv_id: str, nproc: int) -> None:
    """Every node found the same rendezvous: the first host of the nodelist, the job id, all nodes."""
    assert len(decisions) == nnodes
    for node, decision in enumerate(decisions):
        cmd = decision["command"]
        torchrun = cmd[cmd.index("torch.distributed.run") + 1 : cmd.index("-m", cmd.index("torch.distributed.run"))]
        opts = dict(zip(torchrun[::2], torchrun[1::2], strict=False))
        assert opts["--nnodes"] == str(nnodes)
        assert opts["--nproc-per-node"] == str(nproc)
        assert opts["--rdzv-backend"] == "c10d"
        assert opts["--rdzv-endpoint"] == endpoint
        assert opts["--rdzv-id"] == rdzv_id
        assert opts["--max-restarts"] == "3"
        assert decision["placement"]["node_rank"] == node
        assert cmd[cmd.index("-m", cmd.index("torch.distributed.run")) :] == ["-m", "trainer", "train"]


def test_pyxis_script_runs_srun_with_container_and_rendezvous(tmp_path: Path) -> None:
    record = run_with_fake_srun(tmp_path, generate(tmp_path, "slurm-pyxis", "--nodes", "3", "--image", IMAGE), "srun")
    argv = record["argv"]
    assert argv[:2] == ["--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    assert "--container-writable" in argv and "--no-container-mount-home" in argv
    assert "--cpus-per-task=64" in argv  # srun no longer inherits the job's CPUs (Slurm 22.05)
    assert "--container-image=registry.example.com#team/trainkit:0.1.0-cu128-ngc25.03" in argv
    mounts = next(a for a in argv if a.startswith("--container-mounts=")).split("=", 1)[1].split(",")
    assert f"{tmp_path}/data:/data:ro" in mounts
    assert f"{tmp_path}/out:/output" in mounts and f"{tmp_path}/out/cache:/cache" in mounts
    assert argv[-2:] == ["/opt/trainkit/entrypoints/entrypoint.sh", "train"]
    env = record["env"]
    assert env["TRAIN_ARGS"] == "--warmup_steps 5 --weight_decay 0.1"
    assert env["TRAIN_SAVE_STEPS"] == "50"
    assert env["HF_TOKEN"] == SECRET  # read from the .env at run time
    assert env["PYTHONNOUSERSITE"] == "1"
    assert_rendezvous(record["decisions"], 3, "gpu-a07:24242", "4242", 8)


def test_apptainer_script_runs_apptainer_exec_with_binds(tmp_path: Path) -> None:
    sif = tmp_path / "trainkit.sif"
    script = generate(tmp_path, "slurm-apptainer", "--nodes", "3", "--sif", str(sif))
    record = run_with_fake_srun(tmp_path, script, "srun")
    argv = record["argv"]
    start = argv.index("apptainer")
    assert argv[start : start + 5] == ["apptainer", "exec", "--nv", "--no-home", "--writable-tmpfs"]
    binds = f"{tmp_path}/data:/data:ro,{tmp_path}/out:/output,{tmp_path}/out/cache:/cache"
    assert argv[argv.index("--bind") + 1] == binds
    assert argv[-3:] == [str(sif), "/opt/trainkit/entrypoints/entrypoint.sh", "train"]
    assert record["env"]["APPTAINERENV_HF_TOKEN"] == SECRET and record["env"]["APPTAINERENV_TRAIN_SAVE_STEPS"] == "50"
    assert record["env"]["APPTAINERENV_TRAINKIT_IMAGE"] == str(sif)
    assert_rendezvous(record["decisions"], 3, "gpu-a07:24242", "4242", 8)


def test_docker_image_for_apptainer_and_missing_env_file(tmp_path: Path) -> None:
    script = generate(tmp_path, "slurm-apptainer", "--nodes", "2", "--image", IMAGE)
    assert f"docker://{IMAGE}" in script.read_text()
    secrets = Path(f"{script}.secrets")
    assert secrets.stat().st_mode & 0o777 == 0o600 and SECRET in secrets.read_text()
    secrets.unlink()  # the secrets' source is gone: the job stops with a message
    env = job_env(tmp_path, fake_bin(tmp_path, "srun"), SLURM_JOB_ID="1", SLURM_NNODES="2",
                  SLURM_CPUS_ON_NODE="64")  # fmt: skip
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "cannot read" in done.stderr and ".secrets" in done.stderr


def test_user_mistakes_exit_2_with_one_message(tmp_path: Path) -> None:
    cases = [
        (["slurm-pyxis", "--image", IMAGE], "--output"),
        (["slurm-pyxis", "--image", IMAGE, "--output", "/o", "--env-file", str(tmp_path / "nope")], "no such file"),
        (["k8s", "--image", IMAGE], "--output-pvc"),
        (["slurm-apptainer", "--output", "/o", "--sif", "x.img"], ".sif"),
    ]
    bad_env = tmp_path / "bad.env"
    bad_env.write_text("TRAIN_BATCHSIZE=4\n")
    cases.append((["slurm-pyxis", "--image", IMAGE, "--output", "/o", "--env-file", str(bad_env)], "TRAIN_BATCH_SIZE"))
    bad_value = tmp_path / "bad-value.env"
    bad_value.write_text("TRAIN_LR=-1\n")
    cases.append((["k8s", "--image", IMAGE, "--output-pvc", "o", "--env-file", str(bad_value)], "TRAIN_LR"))
    for args, needle in cases:
        done = subprocess.run([sys.executable, str(ROOT / "scripts" / "cluster.py"), *args],
                              capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
        assert done.returncode == 2, (args, done.stderr)
        assert needle in done.stderr and "Traceback" not in done.stderr, done.stderr


# ---------------------------------------------------------------- a real local Slurm


@pytest.mark.parametrize("target", ["slurm-pyxis", "slurm-apptainer"])
def test_sbatch_test_only_accepts_scripts(tmp_path: Path, local_slurm: LocalSlurm, target: str) -> None:
    script = generate(tmp_path, target, "--nodes", "3", "--image", IMAGE, "--partition", PARTITION,
                      "--time", "0:30:00", "--cpus-per-task", "2")  # fmt: skip
    done = subprocess.run(["sbatch", "--test-only", str(script)], env=local_slurm.env, capture_output=True,
                          text=True, cwd=tmp_path, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "to start at" in done.stderr and "tk-n[1-3]" in done.stderr


def test_sbatch_test_only_rejects_impossible_request(tmp_path: Path, local_slurm: LocalSlurm) -> None:
    """The check above can fail: four nodes do not exist here."""
    script = generate(tmp_path, "slurm-pyxis", "--nodes", "4", "--image", IMAGE, "--partition", PARTITION)
    done = subprocess.run(["sbatch", "--test-only", str(script)], env=local_slurm.env, capture_output=True,
                          text=True, cwd=tmp_path, timeout=60)  # fmt: skip
    assert done.returncode != 0


def test_real_sbatch_and_srun_give_each_node_its_rendezvous(tmp_path: Path, local_slurm: LocalSlurm) -> None:
    """Real Slurm sets SLURM_* for each task; a stand-in `apptainer` runs the launcher's dry run there."""
    script = generate(tmp_path, "slurm-apptainer", "--nodes", "2", "--gpus-per-node", "2", "--image", IMAGE,
                      "--partition", PARTITION, "--time", "0:10:00")  # fmt: skip
    env = {**job_env(tmp_path, fake_bin(tmp_path, "apptainer")), "SLURM_CONF": str(local_slurm.conf)}
    done = subprocess.run(["sbatch", "--wait", "--parsable", str(script)], env=env, capture_output=True, text=True,
                          cwd=tmp_path, timeout=180)  # fmt: skip
    job_id = done.stdout.strip().split(";")[0]
    logs = "".join(p.read_text() for p in tmp_path.glob("trainkit-*.out"))
    assert done.returncode == 0, done.stderr + logs
    records = [json.loads((tmp_path / f"apptainer-{n}.json").read_text()) for n in range(2)]
    decisions = [r["decisions"][0] for r in records]
    nodes = records[0]["env"]["SLURM_JOB_NODELIST"]
    # Slurm's own expansion of the allocation's nodelist names the host every node must meet at.
    hostnames = subprocess.run(["scontrol", "show", "hostnames", nodes], env=env, capture_output=True, text=True)
    first = hostnames.stdout.split()[0]
    # This Slurm's GPUs have no devices behind them: the launcher sees none (it does not take SLURM_GPUS_ON_NODE
    # on trust) and runs one process per node.
    assert records[0]["env"]["SLURM_GPUS_ON_NODE"] == "2"
    assert_rendezvous(decisions, 2, f"{first}:{20000 + int(job_id) % 10000}", job_id, 1)
    assert records[0]["env"]["HF_TOKEN"] == SECRET


@pytest.mark.parametrize(
    ("image", "pyxis"),
    [
        ("registry.example.com/team/trainkit:0.1.0", "registry.example.com#team/trainkit:0.1.0"),
        ("localhost:5000/trainkit:latest-cu128", "localhost:5000#trainkit:latest-cu128"),
        ("nvcr.io/org/trainkit:1", "nvcr.io#org/trainkit:1"),
        ("team/trainkit:1", "team/trainkit:1"),  # Docker Hub: no registry part
        ("/lustre/images/trainkit.sqsh", "/lustre/images/trainkit.sqsh"),  # an enroot squashfs file
    ],
)
def test_pyxis_image_names(tmp_path: Path, image: str, pyxis: str) -> None:
    script = generate(tmp_path, "slurm-pyxis", "--image", image)
    assert f"--container-image={pyxis}" in script.read_text()
    assert f"export TRAINKIT_IMAGE={image}\n" in script.read_text()  # provenance.json's image


@pytest.mark.parametrize("target", ["slurm-pyxis", "slurm-apptainer"])
def test_scripts_survive_real_sites(tmp_path: Path, target: str) -> None:
    """Writable root, bind sources created, the .env over the image's ENV, no host HOME, whole nodes (issue 18)."""
    script = generate(tmp_path, target, "--nodes", "2", "--image", IMAGE)
    text = script.read_text()
    out = tmp_path / "out"
    assert f"mkdir -p {out} {out}/cache" in text.splitlines()  # --output and the default /cache, before srun
    assert text.index("mkdir -p") < text.index("\nsrun ")
    assert "export PYTHONNOUSERSITE=1" in text  # ~/.local cannot shadow the image's packages
    names = "TRAIN_MODEL,TRAIN_ARGS,TRAIN_SAVE_STEPS,TRAINKIT_IMAGE,HF_TOKEN,PYTHONNOUSERSITE"  # the image: provenance
    if target == "slurm-pyxis":
        for flag in ("--container-writable", "--no-container-mount-home", f"--container-env={names}"):
            assert f"    {flag} \\" in text, flag
    else:
        assert "--no-home \\" in text and "--writable-tmpfs \\" in text
        assert f'for name in {names.replace(",", " ")}; do export "APPTAINERENV_$name=${{!name}}"; done' in text
    binds = next(line for line in text.splitlines() if "--container-mounts=" in line or "/data:ro," in line)
    assert "$HOME" not in text and str(Path.home()) not in binds
    (tmp_path / "data").rmdir()  # an input that is not there: one message, exit 2, before any container
    env = job_env(tmp_path, fake_bin(tmp_path, "srun"), SLURM_JOB_ID="9", SLURM_NNODES="2", SLURM_CPUS_ON_NODE="8")
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and f"{tmp_path}/data (for /data) does not exist" in done.stderr
    assert not list(tmp_path.glob("srun-*.json"))


def test_cpus_per_task_instead_of_whole_nodes(tmp_path: Path) -> None:
    text = generate(tmp_path, "slurm-pyxis", "--image", IMAGE, "--cpus-per-task", "32", "--mem", "500G").read_text()
    lines = text.splitlines()
    assert "#SBATCH --cpus-per-task=32" in lines and "#SBATCH --mem=500G" in lines
    assert "#SBATCH --exclusive" not in lines
    assert "    --cpus-per-task=32 \\" in lines  # srun asks for them itself (Slurm 22.05+)


def test_placement_options(tmp_path: Path) -> None:
    options = ["--qos", "high", "--constraint", "h100", "--exclude", "gpu[07-08]", "--reservation", "maint",
               "--account", "ml", "--gres", "--dependency", "singleton"]  # fmt: skip
    text = generate(tmp_path, "slurm-pyxis", "--image", IMAGE, *options).read_text()
    for line in ("--qos=high", "--constraint=h100", "--exclude=gpu[07-08]", "--reservation=maint", "--account=ml",
                 "--gres=gpu:8", "--dependency=singleton"):  # fmt: skip
        assert f"#SBATCH {line}" in text.splitlines()
    assert "--gpus-per-node" not in text


# Stand-ins for the trap's tools: `srun` waits for SIGUSR1 (what the launcher answers with a checkpoint) and exits
# 143; `scancel` and `scontrol` record their arguments, and scancel delivers the signal to the step as Slurm does.
# srun sets its trap before it writes step.pid: the test signals as soon as that file exists.
# scancel returns only once the step has ended: the order that lost the step's code (the trap's interrupted `wait`
# gave 138), which happened at random on a loaded machine.
STEP_TOOLS = {
    "srun": "#!/bin/bash\ntrap 'exit 143' USR1\necho $$ > \"$FAKE_RECORD_DIR/step.pid\"\n"
    "while true; do sleep 0.1; done\n",
    "scancel": '#!/bin/bash\necho "scancel $*" >> "$FAKE_RECORD_DIR/calls"\nstep=$(cat "$FAKE_RECORD_DIR/step.pid")\n'
    'kill -"${1#--signal=}" "$step"\nwhile kill -0 "$step" 2>/dev/null; do sleep 0.05; done\n',
    "scontrol": '#!/bin/bash\necho "scontrol $*" >> "$FAKE_RECORD_DIR/calls"\n',
}


@pytest.mark.parametrize(("signal_name", "requeued"), [("USR1", True), ("TERM", False)])
def test_stop_trap_signals_the_step_and_requeues_after_the_time_limit_warning(
    tmp_path: Path, signal_name: str, requeued: bool
) -> None:
    script = generate(tmp_path, "slurm-pyxis", "--nodes", "2", "--image", IMAGE)
    bin_dir = tmp_path / "stepbin"
    bin_dir.mkdir()
    for name, body in STEP_TOOLS.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    env = job_env(tmp_path, bin_dir, SLURM_JOB_ID="777", SLURM_NNODES="2", SLURM_CPUS_ON_NODE="8")
    job = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "step.pid").exists():
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()
            time.sleep(0.1)
        job.send_signal(getattr(signal, f"SIG{signal_name}"))  # Slurm's B:USR1 warning, or preemption's SIGTERM
        _, err = job.communicate(timeout=30)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 143, err
    calls = (tmp_path / "calls").read_text().splitlines()
    # the step gets SIGUSR1, which torchrun ignores and the launcher turns into SIGTERM for the trainer processes
    expected = ["scancel --signal=USR1 777"] + (["scontrol requeue 777"] if requeued else [])
    assert calls == expected, err


def test_sweep_is_a_job_array_with_one_output_per_task(tmp_path: Path, local_slurm: LocalSlurm) -> None:
    """Real Slurm runs one array task per combination; each task's container gets its values and its own folder."""
    script = generate(tmp_path, "slurm-apptainer", "--gpus-per-node", "0", "--image", IMAGE, "--partition", PARTITION,
                      "--time", "0:05:00", "--sweep", "TRAIN_LR=1e-4,3e-4", "--sweep", "TRAIN_SEED=1,2")  # fmt: skip
    assert "#SBATCH --array=0-3" in script.read_text().splitlines()
    recorder = tmp_path / "bin" / "apptainer"
    recorder.parent.mkdir()
    recorder.write_text(
        f"#!{sys.executable}\nimport json, os\n"
        "env = {k[13:]: v for k, v in os.environ.items() if k.startswith('APPTAINERENV_')}\n"
        f"open('{tmp_path}/task-' + os.environ['SLURM_ARRAY_TASK_ID'] + '.json', 'w').write(json.dumps(env))\n"
    )
    recorder.chmod(0o755)
    env = {**job_env(tmp_path, recorder.parent), "SLURM_CONF": str(local_slurm.conf)}
    done = subprocess.run(["sbatch", "--wait", str(script)], env=env, capture_output=True, text=True, cwd=tmp_path,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr + "".join(p.read_text() for p in tmp_path.glob("trainkit-*.out"))
    tasks = [json.loads((tmp_path / f"task-{i}.json").read_text()) for i in range(4)]
    assert [(t["TRAIN_LR"], t["TRAIN_SEED"]) for t in tasks] == [("1e-4", "1"), ("1e-4", "2"), ("3e-4", "1"),
                                                                 ("3e-4", "2")]  # fmt: skip
    assert [t["TRAIN_OUTPUT_DIR"] for t in tasks] == [f"/output/sweep-{i}" for i in range(4)]
    assert all(t["TRAIN_MODEL"] == "tiny" and t["HF_TOKEN"] == SECRET for t in tasks)


def test_sweep_mistakes_exit_2(tmp_path: Path) -> None:
    for sweep, needle in [("TRAIN_LR=fast", "TRAIN_LR='fast'"), ("HF_TOKEN=a,b", "secret"), ("TRAIN_LR", "NAME=")]:
        args = [str(ROOT / "scripts" / "cluster.py"), "slurm-pyxis", "--image", IMAGE, "--output", str(tmp_path)]
        done = subprocess.run([sys.executable, *args, "--sweep", sweep], capture_output=True, text=True)
        assert done.returncode == 2 and needle in done.stderr and "Traceback" not in done.stderr, done.stderr
