"""scripts/run.py: its error paths (no container needed) and the train / Ctrl-C / resume / bad-env flows."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest
import tomllib
from compose_support import (
    GID,
    RUN_PY,
    SECRET,
    TINY_SETTINGS,
    UID,
    assert_owned_by_user,
    assert_secret_absent,
    complete_checkpoints,
    global_step,
    owned_output,
    secret_free_outputs,
    write_dataset,
    write_env,
)
from helpers import assert_user_error
from waiting import wait_for

MAX_STEPS = 15
CACHE_VOLUME = "trainkit-test-runpy-cache"
SAVE_STEPS = 3


def run_py(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120):
    return subprocess.run(
        [sys.executable, str(RUN_PY), *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# --- error paths: one clear line, exit 2, no traceback --------------------------------------------


def test_unreachable_engine(tmp_path):
    result = run_py("train", cwd=tmp_path, env={"DOCKER_HOST": "unix:///nonexistent"})
    assert_user_error(result, "cannot reach the Docker Engine", "DOCKER_HOST")


def test_reproduce_of_a_folder_without_provenance_exits_2_before_the_engine(tmp_path):
    (tmp_path / "old").mkdir()
    result = run_py("reproduce", "old", cwd=tmp_path, env={"DOCKER_HOST": "unix:///nonexistent"})
    assert_user_error(result, f"{tmp_path / 'old' / 'provenance.json'} is missing", "older trainkit")


@pytest.mark.docker
def test_reproduce_of_an_image_found_nowhere_names_the_fix(tmp_path, docker_client):
    (tmp_path / "run").mkdir()
    image = {"reference": "trainkit-gone:never", "id": "sha256:" + "0" * 64}
    (tmp_path / "run" / "provenance.json").write_text(json.dumps({"image": image, "data": {}}))
    result = run_py("reproduce", "run", cwd=tmp_path)
    assert_user_error(result, "trainkit-gone:never", "not on this engine", "--image REF")
    (tmp_path / "run" / "provenance.json").write_text(json.dumps({"image": None, "outside_image": True}))
    assert_user_error(run_py("reproduce", "run", cwd=tmp_path), "outside any trainkit image", "--image REF")


@pytest.mark.docker
def test_missing_image_says_how_to_build(tmp_path, docker_client):
    result = run_py("--image", "trainkit:0.0.0-cpu", "train", cwd=tmp_path)
    assert_user_error(result, "trainkit:0.0.0-cpu", "python scripts/build.py --cpu")
    result = run_py("--image", "trainkit:0.0.0-cu126-ngc24.12", "train", cwd=tmp_path)
    assert_user_error(result, "python scripts/build.py --cuda 12.6")


@pytest.mark.docker
def test_bad_arguments_and_missing_mounts(tmp_path, cpu_image):
    assert_user_error(run_py("--image", cpu_image, "--data", "nowhere", "train", cwd=tmp_path), "--data nowhere")
    assert_user_error(run_py("--image", cpu_image, "--models", "nowhere", "train", cwd=tmp_path), "--models")
    assert_user_error(run_py("--image", cpu_image, "--output", "a/b/c", "train", cwd=tmp_path), "does not exist")
    assert_user_error(run_py("--image", cpu_image, "--env-file", "nope.env", "train", cwd=tmp_path), "nope.env")
    assert_user_error(run_py("--image", cpu_image, "--gpus", "some", "train", cwd=tmp_path), "--gpus")
    assert_user_error(run_py("--image", cpu_image, "fly", cwd=tmp_path), "unknown command 'fly'")
    (tmp_path / "broken.env").write_text("TRAIN_MAX_STEPS=3\nnot a line\n")
    assert_user_error(run_py("--image", cpu_image, "--env-file", "broken.env", "train", cwd=tmp_path), "broken.env:2")


# --- flows against the real engine ---------------------------------------------------------------


@pytest.fixture
def run_project(tmp_path: Path, cpu_image: str):
    folder = tmp_path / "runpy"
    write_dataset(folder / "data")
    owned_output(folder / "output")
    schedule = {"TRAIN_MAX_STEPS": str(MAX_STEPS), "TRAIN_SAVE_STEPS": str(SAVE_STEPS)}
    write_env(folder / ".env", {**TINY_SETTINGS, **schedule})
    yield folder
    client = docker.from_env()
    for container in client.containers.list(all=True, filters={"label": "org.trainkit.launcher=run.py"}):
        if str(folder) in json.dumps(container.attrs["HostConfig"].get("Binds") or []):
            container.remove(force=True)
    with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
        client.volumes.get(CACHE_VOLUME).remove()


def base_args(image: str, memlock: int) -> list[str]:
    return ["--image", image, "--user", f"{UID}:{GID}", "--cache-volume", CACHE_VOLUME,
            "--memlock", str(memlock)]  # fmt: skip


@pytest.mark.docker
@pytest.mark.slow
def test_train_interrupt_resume(run_project, cpu_image, engine_memlock):
    folder = run_project
    output = folder / "output"
    env = {**os.environ, "HF_TOKEN": SECRET}
    command = [sys.executable, str(RUN_PY), *base_args(cpu_image, engine_memlock), "-e", "TRAIN_SEED=7", "train"]
    log_file = folder / "run1.log"

    # Ctrl-C once a checkpoint exists: the container is stopped gracefully, run.py exits 143.
    with log_file.open("w") as log:
        proc = subprocess.Popen(command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: complete_checkpoints(output), 300, "a first checkpoint", interval=0.2)
            labels = [c.labels for c in docker.from_env().containers.list(filters={"label": "org.trainkit.launcher"})]
            assert labels and SECRET not in json.dumps(labels)
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    first_log = log_file.read_text()
    assert code == 143, first_log
    assert "interrupted" in first_log and "HF_TOKEN=***" in first_log
    stopped_at = complete_checkpoints(output)[-1]
    assert stopped_at < MAX_STEPS

    # The same command again resumes and finishes with the uninterrupted step count.
    started = time.monotonic()
    result = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=600, check=False)
    second_log = result.stdout + result.stderr
    assert result.returncode == 0, second_log
    assert f"checkpoint-{stopped_at}" in second_log
    assert global_step(output / f"checkpoint-{complete_checkpoints(output)[-1]}") == MAX_STEPS
    assert (output / "final" / "config.json").exists()
    assert time.monotonic() - started < 600
    assert_owned_by_user(output)
    assert_secret_absent(first_log, second_log)
    secret_free_outputs(output)
    leftovers = docker.from_env().containers.list(all=True, filters={"label": "org.trainkit.launcher=run.py"})
    assert not [c for c in leftovers if str(output) in json.dumps(c.attrs["HostConfig"].get("Binds") or [])]


@pytest.mark.docker
def test_bad_env_value_exits_2_with_the_trainers_message(run_project, cpu_image, engine_memlock):
    started = time.monotonic()
    result = run_py(*base_args(cpu_image, engine_memlock), "-e", "TRAIN_LR=fast", "train", cwd=run_project)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "TRAIN_LR" in result.stdout + result.stderr
    assert time.monotonic() - started < 60


@pytest.mark.docker
def test_any_command_runs_in_the_image_as_the_user(run_project, cpu_image, engine_memlock):
    script = "import os; print('uid', os.getuid(), 'data', sorted(os.listdir('/data')))"
    result = run_py(*base_args(cpu_image, engine_memlock), "--", "python", "-c", script, cwd=run_project)
    assert result.returncode == 0, result.stderr
    assert f"uid {UID} data ['corpus.txt']" in result.stdout
    result = run_py(*base_args(cpu_image, engine_memlock), "--", "python", "-c", "raise SystemExit(7)", cwd=run_project)
    assert result.returncode == 7


@pytest.mark.docker
@pytest.mark.slow
def test_build_if_missing_runs_the_build(tmp_path, cpu_image):
    """The quick start's path: a missing image is built by scripts/build.py (warm here: the fixture built it).
    Asking for a tag that build doesn't make proves the build ran and that its result is checked."""
    result = run_py("--image", "trainkit:0.0.0-cpu", "--build-if-missing", "train", cwd=tmp_path, timeout=1800)
    assert_user_error(result, "running `python scripts/build.py --cpu`", "made no trainkit:0.0.0-cpu")


@pytest.mark.docker
def test_fetch_runs_in_the_image(run_project, cpu_image, engine_memlock):
    """`run.py fetch` reaches `python -m trainer fetch` through the entrypoint: with presets there is nothing to
    download; offline, a Hub model missing from the cache volume is exit 2 naming it and the fix."""
    result = run_py(*base_args(cpu_image, engine_memlock), "fetch", cwd=run_project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "nothing to fetch" in result.stdout + result.stderr
    offline = ["-e", "TRAIN_MODEL=org/not-fetched", "-e", "HF_HUB_OFFLINE=1"]
    result = run_py(*base_args(cpu_image, engine_memlock), *offline, "fetch", cwd=run_project)
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "Traceback" not in output, output
    assert "TRAIN_MODEL=org/not-fetched: revision 'main' is not in the cache /cache/huggingface/hub" in output


@pytest.mark.docker
def test_config_and_diff_run_in_the_image(run_project, cpu_image, engine_memlock):
    """`run.py config` and `run.py diff` reach `python -m trainer config|diff` through the entrypoint (run.py refused
    both, and the entrypoint ran neither: trainer/commands.py is now the one list). diff names container paths."""
    result = run_py(*base_args(cpu_image, engine_memlock), "config", "--json", cwd=run_project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["settings"]["TRAIN_MAX_STEPS"]["value"] == MAX_STEPS
    (run_project / "output" / "a").mkdir()  # no provenance.json: diff's own refusal, from inside the image
    result = run_py(*base_args(cpu_image, engine_memlock), "diff", "/output/a", "/output/a", cwd=run_project)
    assert_user_error(result, "/output/a/provenance.json is missing")


@pytest.mark.docker
@pytest.mark.slow
def test_export_quant_runs_llama_cpp_in_the_image(run_project, cpu_image, engine_memlock):
    """issue 56's in-image form: a run trained by run.py, then `run.py export /output /output/gguf --quant q8_0 --quant
    q4_k_m --quant fp8`: run.py passes export's options through, and the image's own llama.cpp (its converter in
    TRAINKIT_LLAMA_CPP, the llama_cpp binding) converts, quantizes and scores, its llmcompressor overlay
    (TRAINKIT_LLMCOMPRESSOR) makes and scores fp8. As after quickstart: no ./data, so the
    run trains on the embedded corpus, and the gate scores on its tail."""
    shutil.rmtree(run_project / "data")
    args = base_args(cpu_image, engine_memlock)
    result = run_py(*args, "train", cwd=run_project, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    quant = ["--quant", "q8_0", "--quant", "q4_k_m", "--quant", "fp8"]
    result = run_py(*args, "export", "/output", "/output/gguf", *quant, cwd=run_project, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    out = run_project / "output" / "gguf"
    report = json.loads((out / "quant_report.json").read_text())
    versions = tomllib.loads((RUN_PY.parents[1] / "images" / "versions.toml").read_text())
    version = versions["llama_cpp"]["version"]
    overlay = dict(pin.split("==") for pin in versions["llmcompressor"]["wheels"])
    assert [row["type"] for row in report["types"]] == ["q8_0", "q4_k_m", "fp8"]
    fp8 = report["types"].pop()  # the image's llmcompressor overlay, run by the user's uid
    runtime = f"transformers {overlay['transformers']} + compressed-tensors {overlay['compressed-tensors']}"
    assert fp8["pass"] and fp8["runtime"].startswith(runtime), fp8
    assert (out / "fp8" / "config.json").is_file()
    for row in report["types"]:
        assert row["pass"] and row["tokenizer_agrees"], row
        assert row["runtime"] == f"llama.cpp (llama-cpp-python {version})"
        assert (out / row["file"]).stat().st_size == row["bytes"]
        assert (out / row["modelfile"]["file"]).read_text().startswith(f"FROM ./{Path(row['file']).name}\n")
    assert report["eval_text"]["origin"].startswith("the tail of the run's training data")
    assert report["eval_text"]["path"].startswith("/opt/trainkit/trainer/")  # the embedded corpus, in the image
    assert_owned_by_user(run_project / "output")
    serve_and_check_q8_0(args, run_project, out)


def serve_and_check_q8_0(args: list[str], run_project: Path, out: Path) -> None:
    """issue 68's in-image form, on that export: `run.py serve /output/gguf --artifact q8_0` serves it with the image's
    llama.cpp server, its port published on this machine's 127.0.0.1 only; its curl line answers from here (the run has
    no chat template: a completion), `check` from here (the host's trainer, against the same folder, through
    /v1/completions) passes, and Ctrl-C stops the container and removes it."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = run_project / "serve.log"
    with log.open("w") as sink:
        proc = subprocess.Popen([sys.executable, str(RUN_PY), *args, "serve", "/output/gguf", "--artifact", "q8_0",
                                 "--port", str(port)], cwd=run_project, stdout=sink, stderr=subprocess.STDOUT,
                                text=True)  # fmt: skip
    try:
        wait_for(lambda: "check it:" in log.read_text(), 300, "serve in the image", interval=0.5, proc=proc, log=log)
        printed = log.read_text()
        assert f"gguf:q8_0 (q8_0 (gguf/gguf.q8_0.gguf, llama.cpp)) ready at http://127.0.0.1:{port}/v1" in printed
        curl = next(line for line in printed.splitlines() if "ask it:" in line).split("ask it:", 1)[1].strip()
        assert f"http://127.0.0.1:{port}/v1/completions" in curl  # a model without a chat template: plain text
        answer = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=60, check=True)
        assert json.loads(answer.stdout)["choices"][0]["text"], answer.stdout
        report = run_project / "check_report.json"
        checked = subprocess.run([sys.executable, "-m", "trainer", "check", f"http://127.0.0.1:{port}/v1", "--against",
                                  str(out), "--report", str(report)], cwd=RUN_PY.parents[1], capture_output=True,
                                 text=True, timeout=300, check=False)  # fmt: skip
        assert checked.returncode == 0, checked.stdout + checked.stderr[-3000:]
        assert json.loads(report.read_text())["artifact"] == "q8_0"
        proc.send_signal(signal.SIGINT)  # run.py stops the container: SIGTERM to serve, which ends the server
        assert proc.wait(timeout=120) == 143, log.read_text()[-3000:]
        assert "no process of the server is left" in log.read_text()
        left = docker.from_env().containers.list(all=True, filters={"label": "org.trainkit.command=serve"})
        assert not [c for c in left if str(run_project) in json.dumps(c.attrs["HostConfig"].get("Binds"))], left
    finally:
        if proc.poll() is None:
            proc.kill()
