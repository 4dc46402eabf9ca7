"""`serve` and `check` for real, with llama.cpp's server (llama-cpp-python's, the pinned build with its server extra).

One GGUF export of the tiny preset (conftest.py's `tiny_gguf_export`, shared with test_export_quant.py) and, started
once for the module on 127.0.0.1: `serve` on its q8_0 and on its q4_k_m file, which `check` must pass; and three
servers started by hand, which `check` must fail naming the difference: one rendering chats with another template
(--chat_format llama-2, the mistake a user makes by hand), one whose stop token is not the export's (the file's eos
overridden with --kv_overrides), one on another model's file (a copy of q8_0 with its output norm negated: other
weights, a sha256 the export never recorded). Then an endpoint that refuses connections and one that accepts and
never answers (exit 2 within the timeout), serve's refusals (exit 2, before anything starts), and SIGTERM to serve
leaving no process behind. vLLM's side runs in the vLLM pass (test_serve_vllm.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import PYTHON, REPO, base_env
from train_runs import children
from waiting import wait_for

from trainer.check.judge import required
from trainer.export.adapter_layout import problems


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _answers(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@dataclass
class Server:
    proc: subprocess.Popen[str]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


def _start(argv: list[str], log: Path) -> Server:
    port = free_port()
    argv = [a.replace("PORT", str(port)) for a in argv]
    with log.open("w") as sink:
        proc = subprocess.Popen([PYTHON, *argv], cwd=REPO, env={**base_env(), "PYTHONPATH": str(REPO)}, stdout=sink,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    return Server(proc, port, log)


def _other_models_file(out: Path, llama_cpp: Path, folder: Path) -> Path:
    """q8_0 with its final norm negated, under another name: another model's file, same tokenizer."""
    path = folder / "other.q8_0.gguf"
    shutil.copyfile(out / "gguf" / "out.q8_0.gguf", path)
    sys.path.insert(0, str(llama_cpp / "gguf-py"))
    from gguf import GGUFReader

    norm = next(t for t in GGUFReader(path, "r+").tensors if t.name == "output_norm.weight")
    norm.data[...] = norm.data * -1
    return path


@pytest.fixture(scope="module")
def servers(tiny_gguf_export, llama_cpp: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    out, made = tiny_gguf_export
    assert made.returncode == 0, made.stderr[-3000:]
    logs = tmp_path_factory.mktemp("servers")
    q8 = str(out / "gguf" / "out.q8_0.gguf")
    started = {
        "q8_0": _start(["-m", "trainer", "serve", str(out), "--artifact", "q8_0", "--port", "PORT"], logs / "q8.log"),
        "q4_k_m": _start(["-m", "trainer", "serve", str(out), "--artifact", "q4_k_m", "--port", "PORT"],
                         logs / "q4.log"),
        "template": _start(["-m", "llama_cpp.server", "--model", q8, "--port", "PORT", "--chat_format", "llama-2"],
                           logs / "template.log"),
        "stop": _start(["-m", "llama_cpp.server", "--model", q8, "--port", "PORT", "--kv_overrides",
                        "tokenizer.ggml.eos_token_id=int:256"], logs / "stop.log"),
        "other": _start(["-m", "llama_cpp.server", "--model", str(_other_models_file(out, llama_cpp, logs)), "--port",
                         "PORT"], logs / "other.log"),
    }  # fmt: skip
    try:
        for name, server in started.items():
            wait_for(lambda s=server: _answers(s.port), 120, f"the {name} server", interval=0.2, proc=server.proc,
                     log=server.log)  # fmt: skip
        yield started
    finally:
        for server in started.values():
            if server.proc.poll() is None:
                os.killpg(server.proc.pid, signal.SIGTERM)
                server.proc.wait(timeout=60)


def check(run_trainer, url: str, out: Path, report: Path, *more: str):
    result = run_trainer(["check", url, "--against", str(out), "--report", str(report), *more], timeout=300)
    found = json.loads(report.read_text()) if report.is_file() else None
    return result, found


def test_serve_answers_its_curl_line_and_check_agrees_on_q8_0(run_trainer, servers, tiny_gguf_export,
                                                             tmp_path) -> None:  # fmt: skip
    out, _ = tiny_gguf_export
    served = servers["q8_0"]
    printed = wait_for(lambda: "check it:" in served.log.read_text() and served.log.read_text(), 30, "serve's lines")
    assert f"out:q8_0 (q8_0 (gguf/out.q8_0.gguf, llama.cpp)) ready at {served.url}" in printed
    assert f"check it: python -m trainer check {served.url} --against {out}" in printed
    assert f"ollama create out:q8_0 -f {out / 'gguf' / 'out.q8_0.Modelfile'}" in printed
    curl = next(line for line in printed.splitlines() if "ask it:" in line).split("ask it:", 1)[1].strip()
    answer = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=60, check=True)
    chat = json.loads(answer.stdout)
    assert chat["model"] == "out:q8_0" and chat["choices"][0]["message"]["content"], chat
    result, report = check(run_trainer, served.url, out, tmp_path / "report.json")
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert report["pass"] and report["artifact"] == "q8_0" and report["findings"] == []
    assert report["reference"]["source"].startswith("recorded by export")
    assert report["tokenizer"].startswith("equal (POST /extras/tokenize")
    assert all(row["rendering"] == "equal in length (count only)" for row in report["prompts"])
    assert report["end_of_turn"] == ["<|eos|> (id 257): the answer ends there"]
    assert report["answers"]["agreeing"] >= report["answers"]["required"] == 3, report["answers"]
    assert "check passed" in result.stdout and "| # | prompt |" in result.stdout


def test_check_agrees_on_q4_k_m_and_sigterm_to_serve_leaves_no_process(run_trainer, servers, tiny_gguf_export,
                                                                       tmp_path) -> None:  # fmt: skip
    out, _ = tiny_gguf_export
    served = servers["q4_k_m"]
    result, report = check(run_trainer, served.url, out, tmp_path / "report.json")
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert report["artifact"] == "q4_k_m" and report["answers"]["agreeing"] >= 3
    server = children(served.proc.pid)
    assert len(server) == 1, server  # llama.cpp's server, in its own process group
    os.kill(served.proc.pid, signal.SIGTERM)
    assert served.proc.wait(timeout=60) == 143
    assert "no process of the server is left" in served.log.read_text()
    assert not Path(f"/proc/{server[0]}").exists() and not _answers(served.port)


def test_check_names_a_server_that_renders_chats_with_another_template(run_trainer, servers, tiny_gguf_export,
                                                                       tmp_path) -> None:  # fmt: skip
    out, _ = tiny_gguf_export
    result, report = check(run_trainer, servers["template"].url, out, tmp_path / "report.json")
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    found = {f["what"]: f["message"] for f in report["findings"]}
    assert "the server does not render chats as the export's chat template does (4 of 4 prompts" in found["prompt"]
    assert "the server's chat handling (its template, or what it adds) differs" in result.stdout
    assert "model" not in found and "check FAILED" in result.stdout


def test_check_names_a_server_whose_stop_token_is_not_the_exports(run_trainer, servers, tiny_gguf_export,
                                                                  tmp_path) -> None:  # fmt: skip
    out, _ = tiny_gguf_export
    result, report = check(run_trainer, servers["stop"].url, out, tmp_path / "report.json")
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    assert [f["what"] for f in report["findings"]] == ["stop"], report["findings"]
    assert "forced to say <|eos|> (id 257, the export's stop token), the server went on (finish_reason length" in (
        report["findings"][0]["message"])  # fmt: skip


def test_check_names_another_models_file(run_trainer, servers, tiny_gguf_export, tmp_path) -> None:
    out, _ = tiny_gguf_export
    result, report = check(run_trainer, servers["other"].url, out, tmp_path / "report.json")
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    found = {f["what"]: f["message"] for f in report["findings"]}
    assert "other.q8_0.gguf (sha256" in found["model"] and "another model's file" in found["model"]
    assert report["artifact"] is None and report["tokenizer"].startswith("equal")  # same tokenizer, other weights
    assert "the served weights are not the export's" in result.stdout


def test_unreachable_and_hung_endpoints_exit_2_within_the_timeout(run_trainer, tiny_gguf_export, tmp_path) -> None:
    out, _ = tiny_gguf_export
    closed = free_port()
    result, _ = check(run_trainer, f"http://127.0.0.1:{closed}/v1", out, tmp_path / "r.json")
    assert result.returncode == 2 and f"cannot reach http://127.0.0.1:{closed}" in result.stderr, result.stderr
    with socket.socket() as hung:  # accepts connections (the kernel's backlog) and never answers
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)
        start = time.monotonic()
        result, _ = check(run_trainer, f"http://127.0.0.1:{hung.getsockname()[1]}", out, tmp_path / "r.json",
                          "--timeout", "3")  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert "accepted GET /v1/models but did not answer within 3 s (--timeout)" in result.stderr
    assert time.monotonic() - start < 60 and "Traceback" not in result.stderr and not (tmp_path / "r.json").exists()


def test_serve_and_check_refuse_mistakes_with_exit_2(run_trainer, servers, tiny_gguf_export, tmp_path) -> None:
    out, _ = tiny_gguf_export
    (tmp_path / "empty").mkdir()
    cases = {
        ("serve", str(out), "--artifact", "q8_0", "--port", str(servers["q8_0"].port)):
            f"serve --host 127.0.0.1 --port {servers['q8_0'].port}: the port is in use",
        ("serve", str(out)): "it holds several servable artifacts; pick one: --artifact f16: gguf/out.f16.gguf",
        ("serve", str(out), "--artifact", "q9"): "--artifact q9: no such artifact; OUT holds model (./, vllm), f16",
        ("serve", str(out), "--artifact", "model"): "vLLM is not installed here",
        ("serve", str(tmp_path / "empty")): "holds nothing a server can load",
        ("check", servers["q8_0"].url, "--against", str(tmp_path / "none")): "no such folder",
        ("check", "localhost:8000", "--against", str(out)): "not an http(s) URL",
        ("check", servers["q8_0"].url, "--against", str(out), "--model", "x"): "check --model x: "
                                                                               f"{servers['q8_0'].url} serves out:q8_0",
    }  # fmt: skip
    for argv, message in cases.items():
        result = run_trainer(list(argv), env={"PYTHONPATH": str(REPO)}, timeout=120)
        assert result.returncode == 2 and message in result.stderr, (argv, result.stderr[-2000:])
        assert "Traceback" not in result.stderr


@pytest.mark.fast
def test_the_bar_and_vllms_adapter_refusals() -> None:
    """check's bar: the export's measured agreement less a quarter of the prompts; what vLLM's LoRA loader refuses."""
    assert [required(1.0, 4), required(0.75, 4), required(0.5, 4), required(1.0, 1), required(1.0, 10)] == [3, 2, 1,
                                                                                                           1, 8]
    lora = ["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
            "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]  # fmt: skip
    assert problems({"r": 16, "bias": "none"}, lora) == []
    assert problems({"r": 8, "modules_to_save": ["score"]}, [*lora, "base_model.model.score.weight"]) == []
    found = problems({"r": 1024, "bias": "all", "use_dora": True, "modules_to_save": ["lm_head"]},
                     [*lora, "base_model.model.lm_head.weight"])  # fmt: skip
    assert found == ["modules_to_save ['lm_head'] (whole modules trained beside the LoRA matrices)", "DoRA (use_dora)",
                     "trained biases (bias='all')", "rank 1024 (at most 512)"]  # fmt: skip
    resized = problems({"r": 16}, [*lora, "base_model.model.model.embed_tokens.weight"])
    assert resized and "first base_model.model.model.embed_tokens.weight" in resized[0]
