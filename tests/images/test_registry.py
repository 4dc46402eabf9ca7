"""The cluster flow against a real registry (Debian's `docker-registry`, the CNCF distribution registry) on
127.0.0.1: build and push with digests, pull by digest with the labels checked, train from the pulled image,
the offline archive round trip, and `run.py reproduce` pulling a run's recorded digest."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import docker.errors
import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "build" / "records"


def build_py(*args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/build.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


@pytest.fixture(scope="module")
def pushed(registry: str, cpu_image: str, docker_client) -> dict[str, str]:
    """`build.py --cpu --registry R --push`: tag -> pushed repo@sha256 digest, from the build record."""
    proc = build_py("--cpu", "--registry", registry, "--push")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tag = f"{registry}/trainkit:0.1.0-cpu"
    record = json.loads((RECORDS / (tag.replace(":", "_").replace("/", "-") + ".json")).read_text())
    for local in (tag, f"{registry}/trainkit:latest-cpu"):  # the pull below must fetch from the registry
        docker_client.images.remove(local, noprune=True)
    return record["pushed"]


def test_push_records_a_digest_for_every_tag(pushed: dict[str, str], registry: str) -> None:
    assert set(pushed) == {f"{registry}/trainkit:0.1.0-cpu", f"{registry}/trainkit:latest-cpu"}
    for ref in pushed.values():
        repo, _, digest = ref.partition("@")
        assert repo == f"{registry}/trainkit" and digest.startswith("sha256:") and len(digest) == 71
    assert len(set(pushed.values())) == 1  # both tags name the same manifest


def test_pull_by_digest_checks_labels_and_the_image_trains(pushed: dict[str, str], docker_client,
                                                           tmp_path: Path) -> None:  # fmt: skip
    ref = next(iter(pushed.values()))
    proc = build_py("--pull", ref, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "labels match images/versions.toml" in proc.stdout and f"pin jobs to {ref}" in proc.stdout
    out_dir = tmp_path / "output"
    out_dir.mkdir()
    out_dir.chmod(0o777)
    env = {"TRAIN_MAX_STEPS": "2", "TRAIN_SEQ_LEN": "64", "TRAIN_LOG_STEPS": "1"}
    run = subprocess.run(["docker", "run", "--rm", *(f"-e{k}={v}" for k, v in env.items()),
                          "-v", f"{out_dir}:/output", ref], capture_output=True, text=True, timeout=900)  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert (out_dir / "final").is_dir()
    assert json.loads((out_dir / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 2


def test_pull_refuses_an_image_whose_labels_disagree(pushed: dict[str, str], registry: str, docker_client,
                                                     tmp_path: Path) -> None:  # fmt: skip
    (tmp_path / "Dockerfile").write_text(f"FROM {next(iter(pushed.values()))}\n"
                                         "LABEL org.trainkit.pin.transformers=4.0.0\n")  # fmt: skip
    tag = f"{registry}/trainkit:relabelled"
    docker_client.images.build(path=str(tmp_path), tag=tag, rm=True)
    for event in docker_client.images.push(f"{registry}/trainkit", "relabelled", stream=True, decode=True):
        assert "error" not in event, event
    docker_client.images.remove(tag, noprune=True)
    proc = build_py("--pull", tag, timeout=600)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "does not match images/versions.toml" in proc.stderr
    assert "org.trainkit.pin.transformers='4.0.0' (matrix: '5.23.0')" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_pull_of_a_missing_reference_exits_2(registry: str) -> None:
    proc = build_py("--pull", f"{registry}/trainkit:no-such-tag", timeout=300)
    assert proc.returncode == 2 and "cannot pull" in proc.stderr and "Traceback" not in proc.stderr


def test_save_writes_an_archive_that_loads_back(pushed: dict[str, str], docker_client, tmp_path: Path) -> None:
    ref = next(iter(pushed))
    archive = tmp_path / "trainkit.tar"
    proc = build_py("--pull", ref, "--save", str(archive), timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"apptainer build trainkit.sif docker-archive://{archive}" in proc.stdout
    docker_client.images.remove(ref, noprune=True)
    load = subprocess.run([sys.executable, "scripts/run.py", "--load", str(archive), "--gpus", "none", "--", "true"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)  # fmt: skip
    archive.unlink()  # 3 GB: not kept on the disk for the rest of the session
    assert load.returncode == 0, load.stderr[-3000:]
    assert f"loaded {ref}" in load.stderr
    docker_client.images.get(ref)


@pytest.mark.parametrize("target", ["slurm-pyxis", "slurm-apptainer", "k8s"])
def test_cluster_jobs_name_the_digest_of_a_pushed_tag(pushed: dict[str, str], registry: str, target: str,
                                                      tmp_path: Path) -> None:  # fmt: skip
    tag = f"{registry}/trainkit:0.1.0-cpu"
    place = ["--output-pvc", "runs"] if target == "k8s" else ["--output", str(tmp_path / "runs")]
    job = tmp_path / "job"
    proc = subprocess.run([sys.executable, "scripts/cluster.py", target, "--image", tag, *place, "-o", str(job)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    digest = pushed[tag].partition("@")[2]
    text = job.read_text()
    assert digest in text and ":0.1.0-cpu" not in text
    assert f"pinned {tag} to {pushed[tag]}" in proc.stderr


def test_a_missing_image_is_pulled_from_the_published_registry_instead_of_built(
    pushed: dict[str, str], registry: str, cpu_image: str, docker_client, tmp_path: Path
) -> None:
    """quickstart's path (run.py --build-if-missing) with TRAINKIT_REGISTRY naming a registry that holds the image:
    it is pulled, label-checked and tagged, not built, and trains."""
    built = docker_client.images.get(cpu_image).id
    docker_client.images.remove(cpu_image, noprune=True)  # the run must find it missing (restored below)
    try:
        env = {**os.environ, "TRAINKIT_REGISTRY": registry}
        proc = subprocess.run([sys.executable, "scripts/run.py", "--build-if-missing", "--gpus", "none", "--output",
                               str(tmp_path / "output"), "-e", "TRAIN_MAX_STEPS=2", "-e", "TRAIN_SEQ_LEN=64", "train"],
                              cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)  # fmt: skip
    finally:
        with contextlib.suppress(Exception):
            docker_client.images.get(cpu_image)
            built = None
        if built:
            docker_client.images.get(built).tag(*cpu_image.split(":"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"pulled {registry}/trainkit:0.1.0-cpu" in proc.stderr and f"tagged {cpu_image}" in proc.stderr
    assert "scripts/build.py" not in proc.stderr
    assert (tmp_path / "output" / "final").is_dir()


def forget(docker_client, registry: str) -> None:
    """This module's references to the pushed image (its registry's tags and digests, nothing else): a use pulls."""
    for image in docker_client.images.list(name=f"{registry}/trainkit"):
        for name in [*image.tags, *(image.attrs.get("RepoDigests") or [])]:
            if name.startswith(f"{registry}/"):
                with contextlib.suppress(docker.errors.ImageNotFound):  # gone with a reference removed before it
                    docker_client.images.remove(name, noprune=True)


REPRODUCE_CORPUS = "".join(f"{i}: the quick brown fox jumps over the lazy dog\n" for i in range(6))  # 4 steps: 1 epoch
REPRODUCE_SECRET = "hf_reproduceImageToken123456"


def run_py(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "run.py"), *map(str, args)], cwd=cwd,
                          env={**os.environ, "HF_TOKEN": REPRODUCE_SECRET}, capture_output=True, text=True,
                          timeout=600, check=False)  # fmt: skip


def test_reproduce_pulls_the_recorded_digest_and_matches_every_step(pushed: dict[str, str], registry: str,
                                                                    docker_client, tmp_path: Path) -> None:  # fmt: skip
    """A tiny run in the pushed CPU image through `run.py --data DIR` records the image by digest and its mounts beside
    it (run_py.json); with the image gone from the engine, `run.py reproduce OUTPUT_DIR` and no other option pulls
    that digest, mounts DIR again (not ./data) and gets the same loss at every step. DIR moved: exit 2 naming it and
    --data. Given again before the command with one byte changed: refused naming the file; with --allow-changed-data
    the report names the first differing step. No token in the outputs."""
    ref = next(iter(pushed.values()))
    data = tmp_path / "corpora" / "corpus.txt"  # not ./data, which run.py would mount by default
    data.parent.mkdir()
    data.write_text(REPRODUCE_CORPUS)
    options = ["--data", data.parent, "--cache-volume", "trainkit-test-reproduce-cache", "--gpus", "none"]
    settings = {"TRAIN_MODEL": "tiny", "TRAIN_DATA": "/data/corpus.txt", "TRAIN_SEQ_LEN": "32", "TRAIN_SEED": "7",
                "TRAIN_BATCH_SIZE": "2", "TRAIN_LOG_STEPS": "1", "TRAIN_MAX_STEPS": "4"}  # fmt: skip
    output, changed = tmp_path / "output", tmp_path / "changed"
    try:
        first = run_py("--image", ref, *options, "--output", output,
                       *(f"-e{name}={value}" for name, value in settings.items()), "train", cwd=tmp_path)  # fmt: skip
        assert first.returncode == 0, first.stderr[-3000:]
        assert json.loads((output / "provenance.json").read_text())["image"]["reference"] == ref
        assert json.loads((output / "run_py.json").read_text())["mounts"]["/data"] == str(data.parent)
        forget(docker_client, registry)

        again = run_py("reproduce", output, cwd=tmp_path)
        assert again.returncode == 0, again.stderr[-3000:]
        assert f"pulling {ref}, the image the run recorded" in again.stderr
        assert f"{data.parent} -> /data (ro)" in again.stderr  # as recorded, and the recorded cache volume:
        assert "trainkit-test-reproduce-cache -> /cache" in again.stderr
        assert "reproduced: the loss of all 4 logged steps is identical" in again.stdout
        assert "recorded inputs that differ: none" in again.stdout
        published = tmp_path / "output-reproduce"
        assert json.loads((published / "reproduce.json").read_text())["identical"] is True
        assert json.loads((published / "run_py.json").read_text())["mounts"]["/data"] == str(data.parent)
        for text in (again.stdout, again.stderr, *(p.read_text() for p in published.glob("*.json"))):
            assert REPRODUCE_SECRET not in text

        moved = data.parent.rename(tmp_path / "moved")
        gone = run_py("reproduce", output, "--output", changed, cwd=tmp_path)
        assert gone.returncode == 2 and "Traceback" not in gone.stderr, gone.stderr[-3000:]
        assert f"the run mounted {data.parent} at /data" in gone.stderr and "give --data PATH instead" in gone.stderr
        (moved / "corpus.txt").write_bytes(REPRODUCE_CORPUS.replace("quick", "quack", 1).encode())  # one byte
        refused = run_py("--data", moved, "reproduce", output, "--output", changed, cwd=tmp_path)
        assert refused.returncode == 2, refused.stderr[-3000:]
        assert f"--data {moved} given: used instead of the recorded {data.parent}" in refused.stderr
        assert "/data/corpus.txt changed" in refused.stderr and "--allow-changed-data" in refused.stderr
        changed_run = run_py("reproduce", output, "--output", changed, "--allow-changed-data", "--data", moved,
                             cwd=tmp_path)  # fmt: skip
        assert changed_run.returncode == 5, changed_run.stderr[-3000:]
        assert re.search(r"differs: step \d+ has loss", changed_run.stdout), changed_run.stdout
        assert "recorded inputs that differ: provenance.data./data/corpus.txt.sha256\n" in changed_run.stdout
    finally:
        forget(docker_client, registry)  # the digest reference reproduce's pull added
        for volume in docker_client.volumes.list(filters={"name": "trainkit-test-reproduce-cache"}):
            volume.remove(force=True)
