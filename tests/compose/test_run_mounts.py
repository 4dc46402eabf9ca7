"""run.py's record of a run's mounts (scripts/run_mounts.py) and `run.py reproduce` reading it, without an engine:
where the record goes, that it holds no secret, that a refused start puts the earlier one back, and reproduce's
arguments (run.py's options before the command, an option that overrides a recorded folder, one that is gone).
The round trip through a real container is tests/images/test_registry.py's reproduce test."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from helpers import assert_user_error  # noqa: E402
from run_mounts import RECORD_FILE, describe, kept, run_folder, volumes  # noqa: E402

NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent"}
IMAGE = {"TRAINKIT_IMAGE": "trainkit:latest-cpu", "TRAINKIT_IMAGE_ID": "sha256:" + "1" * 64}
TOKEN = "hf_abcdefgh12345678"


def run_py(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, str(ROOT / "scripts" / "run.py"), *map(str, args)]
    env = {**os.environ, **NO_ENGINE}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False)


def mounts_of(tmp_path: Path, data: Path) -> dict[str, dict[str, str]]:
    """What run.py mounts for `--data DATA --output tmp/output` (run_mounts.volumes, as run.py calls it)."""
    args = argparse.Namespace(data=str(data), models=None, output=str(tmp_path / "output"), cache_volume=None,
                              from_record=False)  # fmt: skip
    return volumes(args)


def test_the_record_goes_where_the_trainer_writes_and_holds_no_secret(tmp_path: Path) -> None:
    mounts = mounts_of(tmp_path, tmp_path)
    output = tmp_path / "output"
    assert run_folder({}, mounts) == output
    assert run_folder({"TRAIN_OUTPUT_DIR": "/output/runs/a"}, mounts) == output / "runs" / "a"
    assert run_folder({"TRAIN_OUTPUT_DIR": "b"}, mounts) == output / "b"  # relative to the working directory
    assert run_folder({"TRAIN_OUTPUT_DIR": "/output/../cache/x"}, mounts) is None
    record = describe(IMAGE, mounts, tmp_path / TOKEN / ".env")
    assert record["mounts"] == {"/cache": "trainkit-cache", "/data": str(tmp_path), "/output": str(output)}
    assert record["image"] == {"reference": "trainkit:latest-cpu", "id": IMAGE["TRAINKIT_IMAGE_ID"]}
    assert TOKEN not in json.dumps(record) and record["env_file"] == str(tmp_path / "***" / ".env")


def test_the_record_is_the_one_of_the_start_that_wrote_the_provenance(tmp_path: Path) -> None:
    folder, logged, owner = tmp_path / "output" / "run", [], "1234:1234"  # the container's user, not run.py's
    first, second = describe(IMAGE, mounts_of(tmp_path, tmp_path), None), describe(IMAGE, {}, None)
    with kept(folder, first, owner, False, logged.append):  # TRAIN_OUTPUT_DIR=/output/run: the trainer makes it
        assert not folder.exists()
        folder.mkdir()
        (folder / "provenance.json").write_text("{}")  # its first step is near
    assert json.loads((folder / RECORD_FILE).read_text()) == first
    if os.geteuid() == 0:  # run.py as root (sudo, CI) gives the record to the container's user, as the folder is
        assert (folder / RECORD_FILE).stat().st_uid == 1234
    with kept(folder, second, owner, False, logged.append):  # a second start on the running run, refused by its lock
        assert json.loads((folder / RECORD_FILE).read_text()) == second  # written before the start
    assert json.loads((folder / RECORD_FILE).read_text()) == first
    with kept(folder, second, owner, True, logged.append):  # detached: run.py cannot tell, the new record stays
        pass
    assert json.loads((folder / RECORD_FILE).read_text()) == second
    with kept(tmp_path, first, owner, False, logged.append):  # refused where no record was: none left behind
        assert (tmp_path / RECORD_FILE).is_file()
    assert not (tmp_path / RECORD_FILE).exists()
    with kept(None, second, owner, False, logged.append):
        pass
    assert logged == ["TRAIN_OUTPUT_DIR is not under /output: no run_py.json; reproduce will need --data etc. again"]


def recorded_run(tmp_path: Path, data: Path) -> Path:
    """A run folder as run.py leaves it: provenance.json (by the trainer) and the record of `--data DATA`."""
    folder = tmp_path / "output"
    with kept(folder, describe(IMAGE, mounts_of(tmp_path, data), None), f"{os.getuid()}", True, print):
        (folder / "provenance.json").write_text(json.dumps({"image": {"reference": IMAGE["TRAINKIT_IMAGE"]}}))
    return folder


def test_reproduce_takes_run_py_options_before_the_command_and_says_which_folder_it_mounts(tmp_path: Path) -> None:
    corpora, other = tmp_path / "corpora", tmp_path / "other"
    corpora.mkdir(), other.mkdir()
    recorded_run(tmp_path, corpora)
    # Past the arguments to the engine (none here): `--data DIR reproduce OUT` was refused ("reproduce comes first").
    result = run_py("--data", other, "reproduce", "output", cwd=tmp_path)
    assert_user_error(result, f"--data {other} given: used instead of the recorded {corpora}", "cannot reach")
    result = run_py("reproduce", "output", cwd=tmp_path)
    assert_user_error(result, f"as the run recorded in {tmp_path / 'output' / RECORD_FILE}: --data {corpora}, "
                      "--cache-volume trainkit-cache", "cannot reach the Docker")  # fmt: skip
    result = run_py("--output", "elsewhere", "reproduce", "output", cwd=tmp_path)
    assert_user_error(result, "--output elsewhere before reproduce", f"reproduce {tmp_path / 'output'} --output NEW")


def test_reproduce_names_a_recorded_folder_that_is_gone_and_the_option_that_replaces_it(tmp_path: Path) -> None:
    corpora = tmp_path / "corpora"
    corpora.mkdir()
    recorded_run(tmp_path, corpora)
    corpora.rmdir()
    result = run_py("reproduce", "output", cwd=tmp_path)
    assert_user_error(result, f"the run mounted {corpora} at /data (recorded in {tmp_path / 'output' / RECORD_FILE}); "
                      "it is gone: restore it, or give --data PATH instead")  # fmt: skip
    assert "Docker" not in result.stderr  # said before the engine is asked anything


def test_reproduce_refuses_a_hand_edited_record_with_a_value_of_the_wrong_type(tmp_path: Path) -> None:
    """A list where a mount's host path or the env file goes (issue 59): exit 2 naming the field, as not-JSON does;
    before the fix, a TypeError traceback (exit 1)."""
    corpora = tmp_path / "corpora"
    corpora.mkdir()
    folder = recorded_run(tmp_path, corpora)
    record = json.loads((folder / RECORD_FILE).read_text())
    for field, edit, expected in (
        ("mounts", {**record["mounts"], "/data": [str(corpora)]}, "`mounts` '/data': a list where a host path"),
        ("env_file", [str(tmp_path / ".env")], "`env_file`: a list where a path (text) or null goes"),
        ("image", "trainkit:latest-cpu", "`image`: a str ('trainkit:latest-cpu') where an object"),
    ):
        (folder / RECORD_FILE).write_text(json.dumps({**record, field: edit}))
        result = run_py("reproduce", "output", cwd=tmp_path)
        assert_user_error(result, f"{folder / RECORD_FILE} holds a value of the wrong type: {expected}")
