"""Values written into job files stay inert and read back exactly (scripts/cluster_quote.py).

Shell payloads ($(...), backticks, `;`, quotes, a newline, ${VAR}, non-ASCII) go through every field of each job
flavour: .env settings and secrets, --sweep values, the folders, the image, the #SBATCH fields and every Kubernetes
field. The Slurm scripts then run under bash with stand-ins for `srun` and `apptainer` that record what they were
given (pyxis' `srun --container-*` is recorded the same way); nothing the payloads name may run, and each value
must arrive as given. The manifest is parsed back with the yaml library.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
# every payload writes a file named pwned-* into the job's working folder if the shell ever runs it
SHELL = "$(touch pwned-1)`touch pwned-2`;touch pwned-3 'q' \"dq\" ${HOME} \\ grüße €"
VALUE = SHELL + "\nsecond line; touch pwned-4"
PATH_PART = "d$(touch pwned-5)`touch pwned-6`;touch pwned-7 '\"${HOME} grüße"  # no ',', ':', newline (mounts)
SBATCH = "x$(touch_pwned-8)`touch_pwned-9`;${HOME}grüße"  # #SBATCH lines carry no whitespace or quotes
# .env values: single-quoted, so literal (as compose reads them), and without a single quote of their own
ENV_VALUE = "$(touch pwned-1)`touch pwned-2`;touch pwned-3 \"dq\" ${HOME} \\ grüße €\nsecond; touch pwned-4"
SECRET = "hf_" + ENV_VALUE
IMAGE = "registry.example.com/team/trainkit@sha256:" + "0" * 64  # pinned: no registry lookup

RECORDER = textwrap.dedent(
    """\
    #!{python}
    import json, os, sys
    from pathlib import Path

    args = sys.argv[1:]
    name = Path(sys.argv[0]).name
    env = {{k: v for k, v in os.environ.items() if k.startswith(("MY_", "HF_", "APPTAINERENV_", "TRAIN_"))}}
    Path(os.environ["RECORD_DIR"], name + ".json").write_text(json.dumps({{"argv": args, "env": env}}))
    if name == "srun" and "apptainer" in args:  # srun starts the task: the apptainer stand-in
        os.execvp("apptainer", args[args.index("apptainer"):])
    """
)


def _generate(tmp_path: Path, target: str, *extra: str) -> subprocess.CompletedProcess:
    env_file = tmp_path / ".env"
    env_file.write_text(f"MY_NOTE='{ENV_VALUE}'\nHF_TOKEN='{SECRET}'\n", encoding="utf-8")
    cmd = [sys.executable, str(ROOT / "scripts" / "cluster.py"), target, "--env-file", str(env_file), *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


def _folders(tmp_path: Path) -> dict[str, Path]:
    folders = {name: tmp_path / f"{name}-{PATH_PART}" for name in ("data", "models", "output", "cache")}
    for path in folders.values():
        path.mkdir()
    return folders


def _run_job(tmp_path: Path, script: Path) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("srun", "apptainer", "scancel", "scontrol"):
        (bin_dir / tool).write_text(RECORDER.format(python=sys.executable))
        (bin_dir / tool).chmod(0o755)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TRAIN_", "HF_", "MY_"))}
    env = {**keep, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RECORD_DIR": str(tmp_path), "SLURM_JOB_ID": "7",
           "SLURM_ARRAY_TASK_ID": "1", "SLURM_CPUS_ON_NODE": "4"}  # fmt: skip
    done = subprocess.run(["bash", str(script)], env=env, cwd=work, capture_output=True, text=True, timeout=60)
    assert not list(work.glob("pwned-*")) and not list(tmp_path.glob("pwned-*")), done.stderr
    return done


@pytest.mark.parametrize("target", ["slurm-pyxis", "slurm-apptainer"])
def test_slurm_job_values_stay_inert_and_arrive_as_given(tmp_path: Path, target: str) -> None:
    folders = _folders(tmp_path)
    image = ["--image", f"/images/trainkit-{PATH_PART}.sqsh"] if target == "slurm-pyxis" else \
        ["--sif", str(tmp_path / f"trainkit-{PATH_PART}.sif")]  # fmt: skip
    sbatch_fields = ["job-name", "partition", "account", "time", "qos", "constraint", "exclude", "reservation",
                     "dependency", "mem", "log"]  # fmt: skip
    placement = [arg for field in sbatch_fields for arg in (f"--{field}", SBATCH)]
    script = tmp_path / "job.sbatch"
    made = _generate(tmp_path, target, "--nodes", "2", "--gpus-per-node", "0", *image, *placement,
                     "--sweep", f"MY_SWEEP=a {SHELL},b {SHELL}", "-o", str(script),
                     *(arg for name, path in folders.items() for arg in (f"--{name}", str(path))))  # fmt: skip
    assert made.returncode == 0, made.stderr
    text = script.read_text()
    for field in sbatch_fields:
        assert f"#SBATCH --{'output' if field == 'log' else field}={SBATCH}" in text.splitlines()

    done = _run_job(tmp_path, script)
    assert done.returncode == 0, done.stderr
    srun = json.loads((tmp_path / "srun.json").read_text())
    if target == "slurm-pyxis":
        recorded, argv = srun["env"], srun["argv"]
        mounts = next(a for a in argv if a.startswith("--container-mounts="))
        assert mounts.split("=", 1)[1].split(",") == [
            f"{folders['data']}:/data:ro", f"{folders['models']}:/models:ro", f"{folders['output']}:/output",
            f"{folders['cache']}:/cache"]  # fmt: skip
        assert f"--container-image=/images/trainkit-{PATH_PART}.sqsh" in argv
    else:
        apptainer = json.loads((tmp_path / "apptainer.json").read_text())
        argv = apptainer["argv"]
        recorded = {k.removeprefix("APPTAINERENV_"): v for k, v in apptainer["env"].items() if k.startswith("APPT")}
        assert argv[argv.index("--bind") + 1].split(",")[0] == f"{folders['data']}:/data:ro"
        assert str(tmp_path / f"trainkit-{PATH_PART}.sif") in argv
    assert recorded["MY_NOTE"] == ENV_VALUE and recorded["HF_TOKEN"] == SECRET
    assert recorded["MY_SWEEP"] == f"b {SHELL}"  # array task 1
    assert SECRET not in text


def test_a_missing_folder_is_named_without_running_it(tmp_path: Path) -> None:
    folders = _folders(tmp_path)
    script = tmp_path / "job.sbatch"
    made = _generate(tmp_path, "slurm-pyxis", "--image", "/images/t.sqsh", "-o", str(script),
                     *(arg for name, path in folders.items() for arg in (f"--{name}", str(path))))  # fmt: skip
    assert made.returncode == 0, made.stderr
    folders["data"].rmdir()
    done = _run_job(tmp_path, script)
    assert done.returncode == 2
    assert done.stderr == f"error: {folders['data']} (for /data) does not exist\n"


@pytest.mark.parametrize(
    ("option", "value", "shown"),
    [("--job-name", "a\ntouch pwned", "--job-name"), ("--partition", "gpu a", "--partition"),
     ("--log", "out'%j", "--log"), ("--data", "/d,x", "--data"), ("--image", "reg.io/x:$(id)", "--image"),
     ("--image", "reg.io/x\nevil: 1", "--image")],
)  # fmt: skip
def test_values_an_sbatch_line_or_mount_list_cannot_carry_exit_2(tmp_path: Path, option, value, shown) -> None:
    made = _generate(tmp_path, "slurm-pyxis", "--image", "/i.sqsh", "--output", str(tmp_path / "o"), option, value)
    assert made.returncode == 2 and made.stderr.startswith(f"error: {shown} "), made.stderr
    assert "Traceback" not in made.stderr and not list(tmp_path.glob("*.sbatch"))


def test_k8s_manifest_values_round_trip_through_yaml(tmp_path: Path) -> None:
    fields = {"--namespace": "ns", "--data-pvc": "data", "--models-pvc": "models", "--output-pvc": "output",
              "--cache-pvc": "cache", "--secret-name": "secret", "--service-account": "sa",
              "--priority-class": "prio", "--queue": "queue", "--image-pull-secret": "pull"}
    given = {option: f"{tag}-{VALUE}" for option, tag in fields.items()}
    out = tmp_path / "job.yaml"
    made = _generate(tmp_path, "k8s", "--nodes", "2", "-o", str(out), "--image", IMAGE,
                     "--node-selector", f"zone={VALUE}", "--toleration", f"gpu={SHELL}:NoSchedule",
                     *(a for kv in given.items() for a in kv))  # fmt: skip
    assert made.returncode == 0, made.stderr
    text = out.read_text()
    job = yaml.safe_load(text)
    assert list(job) == ["apiVersion", "kind", "metadata", "spec"]  # the header's comments stayed comments
    assert all(line.startswith("#") for line in text.split("apiVersion:")[0].splitlines())
    pod = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    container = pod["containers"][0]
    volumes = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in volumes}
    assert job["metadata"]["namespace"] == given["--namespace"]
    assert claims == {name: given[f"--{name}-pvc"] for name in ("data", "models", "output", "cache")}
    assert container["image"] == IMAGE
    assert pod["serviceAccountName"] == given["--service-account"]
    assert pod["priorityClassName"] == given["--priority-class"]
    assert pod["imagePullSecrets"] == [{"name": given["--image-pull-secret"]}]
    assert pod["nodeSelector"] == {"zone": VALUE}
    assert pod["tolerations"] == [{"key": "gpu", "operator": "Equal", "value": SHELL, "effect": "NoSchedule"}]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == given["--queue"]
    env = {e["name"]: e for e in container["env"]}
    assert env["MY_NOTE"]["value"] == ENV_VALUE
    assert (env["TRAINKIT_IMAGE"]["value"], env["TRAINKIT_IMAGE_DIGEST"]["value"]) == (IMAGE, IMAGE.split("@")[1])
    assert env["HF_TOKEN_PATH"]["value"] == "/run/secrets/trainkit/HF_TOKEN" and SECRET not in text
    assert pod["volumes"][-1]["secret"]["secretName"] == given["--secret-name"]
