"""`serve` with vLLM's CPU build (the vLLM pass: bash tests/rl/run.sh) and `check` against it: an export folder and
a LoRA adapter that vLLM loads on it, served by one `serve ADAPTER` (vLLM loads the base export and the adapter),
started once for the module on 127.0.0.1.

The base is the tiny preset's architecture with random weights, exported (`export FOLDER BASE`) without a chat
template: `check` asks it through /v1/completions. A LoRA run on BASE with the chatml template (TRAIN_CHAT_TEMPLATE)
is exported twice: --adapter-only (ADAPTER, the layout vLLM's loader takes) and merged (MERGED). `check` passes
against BASE, against ADAPTER, and with the adapter's answers against MERGED (vLLM's LoRA answers greedy as the merged
model does in Transformers); the base's answers against ADAPTER differ (the adapter is applied). SIGTERM to serve
ends vLLM's server, engine and worker processes. Skipped where no vLLM is installed (the main venv).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import PYTHON, REPO, base_env
from hub_support import run_env, save_tiny_model
from test_serve_check import free_port
from train_runs import children
from waiting import wait_for

from trainer.vllm_compat import installed_vllm

pytestmark = pytest.mark.skipif(installed_vllm() is None, reason="needs vLLM: the CPU RL venv (bash tests/rl/run.sh)")


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory, run_trainer) -> dict[str, Path]:
    """BASE (an export, no chat template), ADAPTER (--adapter-only) and MERGED of a LoRA run on it."""
    root = tmp_path_factory.mktemp("vllm-exports")
    save_tiny_model(root / "raw")
    made = {"base": root / "base", "adapter": root / "adapter", "merged": root / "merged"}
    steps = [["export", str(root / "raw"), str(made["base"])], None,
             ["export", str(root / "output"), str(made["adapter"]), "--adapter-only"],
             ["export", str(root / "output"), str(made["merged"])]]  # fmt: skip
    env = run_env(root, model=made["base"], lora=1, lr=0.01, max_steps=10, save_steps=10, seq_len=64,
                  chat_template="chatml")  # fmt: skip
    for step in steps:
        result = run_trainer(step or [], env=env if step is None else None, timeout=900)
        assert result.returncode == 0, (step, result.stderr[-3000:])
    return made


@pytest.fixture(scope="module")
def served(exports: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    """`serve ADAPTER` (vLLM: BASE and the adapter), its log and its URL."""
    log = tmp_path_factory.mktemp("vllm-serve") / "serve.log"
    port = free_port()
    with log.open("w") as sink:
        proc = subprocess.Popen([PYTHON, "-m", "trainer", "serve", str(exports["adapter"]), "--port", str(port)],
                                cwd=REPO, env={**base_env(), "PYTHONPATH": str(REPO)}, stdout=sink,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    try:
        wait_for(lambda: "ready at" in log.read_text(), 900, "vLLM's server", interval=0.5, proc=proc, log=log)
        yield proc, log, f"http://127.0.0.1:{port}/v1"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def check(run_trainer, url: str, out: Path, model: str, report: Path) -> tuple:
    result = run_trainer(["check", url, "--against", str(out), "--model", model, "--report", str(report)],
                         timeout=600)  # fmt: skip
    print(result.stdout)
    return result, json.loads(report.read_text())


def test_check_passes_against_the_export_folder_and_the_adapter_as_vllm_serves_them(run_trainer, exports, served,
                                                                                     tmp_path) -> None:  # fmt: skip
    _proc, log, url = served
    printed = log.read_text()
    assert f"serve: adapter (adapter (adapter_config.json, vllm)) ready at {url}" in printed
    assert "--enable-lora --lora-modules adapter=" in printed and "--chat-template" in printed
    result, report = check(run_trainer, url, exports["base"], "base", tmp_path / "base.json")
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert not report["reference"]["chat"] and report["artifact"] == "model"  # no chat template: /v1/completions
    assert report["tokenizer"].startswith("equal (POST /tokenize")
    result, report = check(run_trainer, url, exports["adapter"], "adapter", tmp_path / "adapter.json")
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert report["reference"]["chat"] and report["artifact"] == "adapter"
    assert all(row["rendering"] == "equal (the server's tokens)" for row in report["prompts"]), report["prompts"]
    assert report["answers"]["agreeing"] >= report["answers"]["required"] == 3
    result, report = check(run_trainer, url, exports["merged"], "adapter", tmp_path / "merged.json")
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert report["answers"]["agreeing"] >= 3, report["answers"]  # vLLM's LoRA answers as the merged model does
    result, report = check(run_trainer, url, exports["adapter"], "base", tmp_path / "other.json")
    assert result.returncode == 1 and "answers" in {f["what"] for f in report["findings"]}, result.stdout


def test_sigterm_to_serve_ends_vllms_server_engine_and_workers(served) -> None:
    proc, log, _ = served
    server = children(proc.pid)
    assert len(server) == 1, server
    group = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _group(int(p.name)) == server[0]]
    assert len(group) >= 3, group  # the API server, its engine core and its worker
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=120) == 143, log.read_text()[-3000:]
    assert "no process of the server is left" in log.read_text()
    assert not [pid for pid in group if Path(f"/proc/{pid}").exists()]


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None
