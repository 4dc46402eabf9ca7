"""TRAIN_REPORT_TO through Transformers' own callbacks, against real trackers: a real `mlflow server` on 127.0.0.1
(sqlite backend, from the installed package; read back through its REST API) and W&B in offline mode (its run files
read back with the wandb package). One run and its resume feed both."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator

import pytest
from hub_support import run_env
from train_runs import finish, logged_steps, start, train_env
from waiting import wait_for
from wandb_files import wandb_records

SECRET = "hf_trackerSecretTokenValue123456"
PASSWORD = "s3cretPassw0rd"
SERVERS: dict[str, subprocess.Popen] = {}  # url -> the mlflow_server fixture's process (the outage test stops it)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`mlflow server` with a sqlite store; its start time is printed (pytest -s) for the docs."""
    root = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    started = time.monotonic()
    log = open(root / "server.log", "w")  # noqa: SIM115 - the server writes it until the fixture ends
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--default-artifact-root", str(root / "artifacts")],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        while time.monotonic() - started < 180:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2).close()
                break
            except OSError:
                assert server.poll() is None, (root / "server.log").read_text()[-3000:]
                time.sleep(0.5)
        print(f"mlflow server answered after {time.monotonic() - started:.1f}s")
        SERVERS[url] = server
        yield url
    finally:
        if server.poll() is None:
            server.terminate()
        server.wait(timeout=30)
        log.close()


def _api(url: str, path: str, **query: str) -> dict:
    with urllib.request.urlopen(f"{url}/api/2.0/mlflow/{path}?{urllib.parse.urlencode(query)}", timeout=10) as r:
        return json.loads(r.read())


def _history_steps(records: list) -> list[int]:
    steps = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
            if "train/loss" in items:
                steps.append(int(json.loads(items["train/global_step"])))
    return steps


def test_mlflow_and_wandb_log_the_run_and_its_resume_without_secrets(run_trainer, mlflow_server, tmp_path) -> None:
    questions = tmp_path / "questions.jsonl"  # TRAIN_EVAL_GENERATE's samples, one question holding a token
    questions.write_text(json.dumps({"prompt": f"Repeat {SECRET} please:", "completion": " no"}) + "\n")
    env = run_env(tmp_path, report_to="tensorboard,wandb,mlflow", max_steps=2, save_steps=2,
                  args="--weight_decay 0.01", eval_data=questions, eval_generate=1, seq_len=64)  # fmt: skip (a token in
    # TRAIN_ARGS is refused: test_secrets_outputs)
    credentialed = mlflow_server.replace("http://", f"http://user:{PASSWORD}@")  # the userinfo is not the host
    env.update(MLFLOW_TRACKING_URI=credentialed, MLFLOW_EXPERIMENT_NAME="trainkit-test", HF_TOKEN=SECRET,
               HF_ENDPOINT=f"https://user:{PASSWORD}@mirror.example")  # fmt: skip
    first = run_trainer([], env=env, timeout=600)
    assert first.returncode == 0, first.stderr[-4000:]
    assert "W&B: offline (no WANDB_API_KEY)" in first.stderr
    assert f"View run {tmp_path.name}-output at: {mlflow_server}/#/experiments/" in first.stdout  # MLflow's own link
    assert PASSWORD not in first.stdout + first.stderr
    second = run_trainer([], env={**env, "TRAIN_MAX_STEPS": "4"}, timeout=600)
    assert second.returncode == 0, second.stderr[-4000:]
    assert PASSWORD not in second.stdout + second.stderr
    out = tmp_path / "output"
    runs = json.loads((out / "trackers.json").read_text())["trackers"]
    assert json.loads((out / "checkpoint-4" / "trainkit_complete").read_text())["trackers"] == runs

    # MLflow: one run, continued; the loss of every step; no secret in its params or tags
    experiment = _api(mlflow_server, "experiments/get-by-name", experiment_name="trainkit-test")["experiment"]
    found = json.loads(urllib.request.urlopen(urllib.request.Request(
        f"{mlflow_server}/api/2.0/mlflow/runs/search", data=json.dumps(
            {"experiment_ids": [experiment["experiment_id"]]}).encode(),
        headers={"Content-Type": "application/json"}), timeout=10).read())["runs"]  # fmt: skip
    assert [r["info"]["run_id"] for r in found] == [runs["mlflow"]["run_id"]]
    run = _api(mlflow_server, "runs/get", run_id=runs["mlflow"]["run_id"])["run"]
    assert run["info"]["status"] == "FINISHED" and run["info"]["run_name"] == f"{tmp_path.name}-output"
    history = _api(mlflow_server, "metrics/get-history", run_id=runs["mlflow"]["run_id"], metric_key="loss")["metrics"]
    assert sorted(m["step"] for m in history) == [1, 2, 3, 4]
    params = {p["key"]: p["value"] for p in run["data"]["params"]}
    assert params["TRAIN_REPORT_TO"] == "tensorboard,wandb,mlflow" and params["TRAIN_ARGS"] == "--weight_decay 0.01"
    assert params["decision/precision"] == "fp32"
    logged = json.dumps(run)
    assert SECRET not in logged and PASSWORD not in logged
    query = urllib.parse.urlencode({"run_id": runs["mlflow"]["run_id"], "path": "samples"})
    with urllib.request.urlopen(f"{mlflow_server}/api/2.0/mlflow/artifacts/list?{query}", timeout=10) as listed:
        artifacts = json.loads(listed.read())["files"]
    assert [a["path"] for a in artifacts] == ["samples/step-0000002.jsonl", "samples/step-0000004.jsonl"]
    query = urllib.parse.urlencode({"run_uuid": runs["mlflow"]["run_id"], "path": artifacts[0]["path"]})
    with urllib.request.urlopen(f"{mlflow_server}/get-artifact?{query}", timeout=10) as artifact:
        assert json.loads(artifact.read())["prompt"] == "Repeat *** please:"  # masked there too
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [2, 4] and samples[0]["prompt"] == "Repeat *** please:"

    # W&B: offline run files under the output folder, both halves with the same run id (wandb sync joins them)
    offline = sorted((out / "wandb").glob("offline-run-*"))
    assert len(offline) == 2 and all(p.name.endswith(runs["wandb"]["run_id"]) for p in offline)
    halves = [wandb_records(p) for p in offline]
    run_records = [r.run for records in halves for r in records if r.WhichOneof("record_type") == "run"]
    assert {r.run_id for r in run_records} == {runs["wandb"]["run_id"]}
    assert _history_steps(halves[0]) == [1, 2] and _history_steps(halves[1]) == [3, 4]
    tables = [table for half in offline for table in half.rglob("samples_*.table.json")]
    assert len(tables) == 2  # a W&B table per evaluation (steps 2 and 4)
    assert json.loads(tables[0].read_text())["data"][0][1] == "Repeat *** please:"
    assert any((out / "runs").rglob("events.out.tfevents.*"))
    for path in [*(out / "wandb").rglob("*"), *(out / "runs").rglob("*"), *(out / "mlruns").rglob("*")]:
        if path.is_file():
            data = path.read_bytes()
            assert SECRET.encode() not in data and PASSWORD.encode() not in data, path


@pytest.mark.parametrize(
    ("tracker", "env", "shown"),
    [("mlflow", {"MLFLOW_TRACKING_URI": f"http://user:{PASSWORD}@127.0.0.1:{{port}}"}, "MLflow, but http://***@127.0.0.1:"),
     ("wandb", {"WANDB_API_KEY": PASSWORD, "WANDB_BASE_URL": "http://127.0.0.1:{port}"}, "W&B, but http://127.0.0.1:")],
)  # fmt: skip
def test_unreachable_tracker_exits_2_naming_it(run_trainer, tmp_path, tracker, env, shown) -> None:
    port = _free_port()
    full = {**run_env(tmp_path, report_to=tracker), **{k: v.format(port=port) for k, v in env.items()}}
    result = run_trainer([], env=full, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"TRAIN_REPORT_TO names {shown}{port}" in result.stderr and "cannot be reached" in result.stderr
    assert PASSWORD not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("value", "expected"),
    [("tensorboard,comet", "unknown tracker 'comet'"), ("none,wandb", "none cannot be combined"),
     ("wandb,wandb", "wandb named twice"), ("mlflow,", "empty entry")],
)  # fmt: skip
def test_bad_report_to_exits_2_before_torch(run_trainer, imported_modules, tmp_path, value, expected) -> None:
    env = run_env(tmp_path, report_to=value)
    result = run_trainer(["config"], env=env, python_args=["-X", "importtime"])
    assert result.returncode == 2
    assert f"TRAIN_REPORT_TO={value!r}" in result.stderr and expected in result.stderr
    assert "torch" not in imported_modules(result.stderr)


def test_an_mlflow_server_lost_mid_run_costs_the_run_nothing(mlflow_server, tmp_path) -> None:
    """Last in this module: it stops the module's server. The run logs to it, loses it after step 2, and still
    trains to the end, writes its checkpoints and final/, and exits 0; the loss is reported once, masked."""
    out = tmp_path / "output"
    env = {**train_env(out, report_to="mlflow", max_steps=6, save_steps=3),
           "MLFLOW_TRACKING_URI": mlflow_server.replace("http://", f"http://user:{PASSWORD}@")}  # fmt: skip
    proc = start(env)
    wait_for(lambda: 2 in logged_steps(out), 300, "step 2 logged", proc=proc)
    server = SERVERS[mlflow_server]
    os.killpg(server.pid, signal.SIGKILL)  # the server and its workers: gone without a word
    server.wait(timeout=30)
    code, err = finish(proc)
    assert code == 0, err[-4000:]
    assert logged_steps(out) == [1, 2, 3, 4, 5, 6]
    assert (out / "final" / "model.safetensors").is_file() and (out / "checkpoint-6").is_dir()
    assert err.count("MLflow stopped working") == 1 and "it is left out for the rest of this run" in err
    assert "Traceback" not in err and PASSWORD not in err
