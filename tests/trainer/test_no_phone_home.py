"""Nothing phones home by default: a preference training run (TRL's trainer pings its usage unless told not to), then
`generate` and `eval` on its model, each with every proxy variable pointed at a recording proxy on 127.0.0.1 and
none of the test suite's offline switches: the proxy must see no request (the run needs nothing from the network).
The image sets the same defaults as `python -m trainer` (trainer/__main__.py's NO_TELEMETRY, the Dockerfile's ENV).
"""

from __future__ import annotations

import json
import os
import socketserver
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import PYTHON, REPO
from preference_data import pairs, write_jsonl

from trainer.__main__ import NO_TELEMETRY

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy")


class _Recorder(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[str] = []


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        first = self.rfile.readline(4096).decode("latin-1").strip()
        self.server.requests.append(first or "(a connection with no request line)")  # type: ignore[attr-defined]
        self.wfile.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


@pytest.fixture
def proxy() -> Iterator[_Recorder]:
    server = _Recorder()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "trainer", *argv], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900, check=False)  # fmt: skip


def test_training_generate_and_eval_make_no_request(proxy: _Recorder, tmp_path: Path) -> None:
    address = f"http://127.0.0.1:{proxy.server_address[1]}"  # a user's defaults: no offline switch set
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": "1", "HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf"), "NO_PROXY": "",
           "no_proxy": "", **dict.fromkeys(PROXY_VARIABLES, address)}  # fmt: skip
    data = write_jsonl(tmp_path / "pairs.jsonl", pairs(16))
    out = tmp_path / "out"
    train = {"TRAIN_METHOD": "dpo", "TRAIN_CHAT_TEMPLATE": "chatml", "TRAIN_LORA": "1", "TRAIN_SEQ_LEN": "96",
             "TRAIN_BATCH_SIZE": "4", "TRAIN_MAX_STEPS": "2", "TRAIN_SAVE_STEPS": "2", "TRAIN_DATA": str(data),
             "TRAIN_OUTPUT_DIR": str(out)}  # fmt: skip
    result = _run([], {**env, **train})
    assert result.returncode == 0, result.stderr[-3000:]
    assert proxy.requests == [], f"training asked the network: {proxy.requests}"
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"messages": [{"role": "user", "content": "say cat sun"}]}])
    result = _run(["generate", str(out), "--input", str(prompts), "--output", str(tmp_path / "answers.jsonl"),
                   "--max-new-tokens", "4"], env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    chat = [{"messages": [{"role": "user", "content": "say cat sun"}, {"role": "assistant", "content": "cat sun ok"}]}]
    result = _run(["eval", str(out), "--data", str(write_jsonl(tmp_path / "chat.jsonl", chat)), "--output",
                   str(tmp_path / "eval"), "--max-new-tokens", "4"], env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "eval" / "eval_results.json").read_text())["records_generated"] == 1
    assert proxy.requests == [], f"generate or eval asked the network: {proxy.requests}"


def test_the_image_sets_the_same_defaults() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    for name, value in NO_TELEMETRY.items():
        assert f"    {name}={value}" in dockerfile, f"the Dockerfile's ENV lacks {name}={value}"
