"""TRAIN_PUSH_TO_HUB and `python -m trainer push` against the stand-in Hub (hub_server.py): huggingface_hub's own
create_repo / upload_folder calls, then snapshot_download of what arrived, compared and loaded."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from pathlib import Path

from conftest import PYTHON, REPO, base_env
from hub_support import online, run_env
from waiting import wait_for

WRITE = "hf_writeTokenOfTheStandInHub12345"
REFUSED = "hf_readOnlyTokenTheHubRefuses1234"


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_push_to_hub_uploads_the_verified_export_privately(run_trainer, hub, tmp_path) -> None:
    import torch
    from huggingface_hub import snapshot_download
    from transformers import AutoModelForCausalLM

    hub.write_tokens.add(WRITE)
    env = online(run_env(tmp_path, push_to_hub="org/pushed@v1"), hub)
    result = run_trainer([], env={**env, "HF_TOKEN": WRITE}, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    out = tmp_path / "output"
    repo = hub.repos[("models", "org/pushed")]
    assert repo.private and "v1" in repo.refs
    folder = Path(snapshot_download("org/pushed", revision="v1", token=WRITE, endpoint=hub.url,
                                    cache_dir=str(tmp_path / "download")))  # fmt: skip
    pushed = {k: v for k, v in _files(folder).items() if k != ".gitattributes"}
    assert pushed == _files(out / "export") and "model.safetensors" in pushed and "README.md" in pushed
    ids = torch.arange(20).unsqueeze(0)
    with torch.no_grad():
        got = AutoModelForCausalLM.from_pretrained(folder)(input_ids=ids).logits
        want = AutoModelForCausalLM.from_pretrained(out / "final")(input_ids=ids).logits
    assert torch.equal(got, want)
    for path, data in _files(out).items():
        assert WRITE.encode() not in data, path
    assert WRITE not in result.stderr + result.stdout


def test_failed_push_after_a_finished_run_exits_3_and_keeps_final(run_trainer, hub, tmp_path) -> None:
    """Through the launcher with two processes (torchrun), as in the image: a failed push must not look like a crashed
    worker, which torchrun would restart (training again); the launcher exits 3 once every worker is done."""
    hub.write_tokens.add(WRITE)
    env = online(run_env(tmp_path, push_to_hub="org/refused", nproc_per_node=2), hub)
    result = run_trainer(["train"], env={**env, "HF_TOKEN": REFUSED}, module="trainer.launch", timeout=600)
    assert result.returncode == 3, result.stderr[-4000:]
    assert "refused (403)" in result.stderr and "final/ is kept" in result.stderr
    assert result.stderr.count("INFO finished: 2 steps") == 1  # trained once: no restart of the worker group
    assert (tmp_path / "output" / "final" / "model.safetensors").is_file()
    assert ("models", "org/refused") not in hub.repos


def test_push_errors_exit_2_naming_the_case(run_trainer, hub, tmp_path) -> None:
    hub.write_tokens.add(WRITE)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    home = {"HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0"}
    at = {**home, "HF_ENDPOINT": hub.url}

    def push(env: dict[str, str], repo: str = "org/m") -> tuple[int, str]:
        result = run_trainer(["push", str(model), repo], env=env, timeout=300)
        assert "Traceback" not in result.stderr
        return result.returncode, result.stderr

    code, err = push(at)
    assert code == 2 and "no Hub token" in err
    code, err = push({**at, "HF_TOKEN": REFUSED})
    assert code == 2 and "refused (403)" in err
    token_file = tmp_path / "token"
    token_file.write_text(WRITE)
    code, err = push({**at, "HF_TOKEN_PATH": str(token_file)}, "org/from-file")  # the token from HF_TOKEN_PATH
    assert code == 0, err
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    code, err = push({**home, "HF_TOKEN": WRITE, "HF_ENDPOINT": f"http://127.0.0.1:{closed}"})
    assert code == 2 and "cannot be reached" in err
    assert (model / "config.json").read_text() == "{}"  # the local model is left as it was


def _push_started(folder: Path, env: dict[str, str], err: Path) -> subprocess.Popen[str]:
    """`python -m trainer push FOLDER org/m` in its own session, stderr to `err`."""
    with err.open("w") as sink:
        return subprocess.Popen([PYTHON, "-m", "trainer", "push", str(folder), "org/m"], cwd=REPO,
                                env={**base_env(), **env}, stdout=subprocess.DEVNULL, stderr=sink, text=True,
                                start_new_session=True)  # fmt: skip


def test_an_interrupted_push_and_two_at_once_leave_only_whole_commits(hub, tmp_path) -> None:
    """A push held at its commit (the stand-in holds commit requests) and stopped by SIGTERM exits 143 saying the
    upload is all or nothing; two pushes of two folders (the same file names) held at once both finish, two commits.
    Every commit on the branch holds one whole folder: never one folder's config beside the other's notes."""
    hub.write_tokens.add(WRITE)
    env = {"HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": hub.url,
           "HF_TOKEN": WRITE}  # fmt: skip
    wanted = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"made_by": name}))
        (tmp_path / name / "notes.txt").write_text(f"folder {name}\n" * 2000)
        wanted.append(_files(tmp_path / name))
    commit = "POST /api/models/org/m/commit/main"
    hub.commits_open.clear()
    try:
        stopped = _push_started(tmp_path / "a", env, tmp_path / "stopped.err")
        wait_for(lambda: commit in hub.requests, 120, "the commit request", proc=stopped)
        os.killpg(stopped.pid, signal.SIGTERM)
        assert stopped.wait(timeout=60) == 143, (tmp_path / "stopped.err").read_text()[-3000:]
        pushes = [_push_started(tmp_path / name, env, tmp_path / f"{name}.err") for name in ("a", "b")]
        wait_for(lambda: hub.requests.count(commit) == 3, 120, "two commit requests at once", proc=pushes[0])
    finally:
        hub.commits_open.set()
    err = (tmp_path / "stopped.err").read_text()
    assert "push interrupted: the upload is one commit, so org/m holds all of" in err and "Traceback" not in err
    for push, name in zip(pushes, ("a", "b"), strict=True):
        assert push.wait(timeout=120) == 0, (tmp_path / f"{name}.err").read_text()[-3000:]
    repo = hub.repos[("models", "org/m")]
    commits = [{k: v for k, v in files.items() if k != ".gitattributes"} for files in repo.commits.values()]
    assert all(files in ({}, *wanted) for files in commits), [sorted(f) for f in commits]
    assert wanted[0] in commits and wanted[1] in commits  # both pushes landed, each whole
    assert commits[-1] == {k: v for k, v in repo.commits[repo.refs["main"]].items() if k != ".gitattributes"}
