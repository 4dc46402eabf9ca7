"""Every row's stack trains, inside its stand-in image (`standin_image`: 12.1 and 12.8 by default, every row with
`--all-rows`): the tiny preset trains, a SIGTERM checkpoint resumes to identical weights, `config --json` speaks
that transformers version's argument names, and each switch the row cannot run (scripts/matrix.py: compat's rules on
the row's stack) exits 2 with its reason. The trainer in the image knows those facts from its installed versions
(trainer/compat.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytestmark = [pytest.mark.docker, pytest.mark.slow]
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import matrix  # noqa: E402

_MATRIX = matrix.load()
ROWS = {**_MATRIX.entries, matrix.RL_ROW: _MATRIX.rl}  # the online-RL row's stand-in is a row too (`--all-rows`)
TINY = {"TRAIN_SEQ_LEN": "32", "TRAIN_BATCH_SIZE": "2", "TRAIN_LOG_STEPS": "1", "TRAIN_MAX_STEPS": "8",
        "TRAIN_SAVE_STEPS": "100", "TRAIN_SEED": "7", "TRAIN_DETERMINISTIC": "1"}  # fmt: skip
FIELDS_PROBE = (
    "import dataclasses, json, transformers; "
    "fields = [f.name for f in dataclasses.fields(transformers.TrainingArguments)]; "
    "print(json.dumps([transformers.__version__, fields]))"
)


def run(client, image: str, argv: list[str], env: dict[str, str] | None = None, output: Path | None = None,
        stderr: bool = True):  # fmt: skip
    """(exit code, output) of `argv` through the image's entrypoint, as the host user."""
    volumes = {str(output): {"bind": "/output", "mode": "rw"}} if output else {}
    container = client.containers.run(image, argv, environment=env or {}, user=f"{os.getuid()}:{os.getgid()}",
                                      volumes=volumes, detach=True)  # fmt: skip
    try:
        status = container.wait(timeout=900)
        return status["StatusCode"], container.logs(stderr=stderr).decode(errors="replace")
    finally:
        container.remove(force=True)


def steps(output: Path) -> list[int]:
    path = output / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def same_weights(a: Path, b: Path) -> bool:
    left, right = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)


def test_config_json_uses_the_rows_transformers_argument_names(standin_image: str, docker_client) -> None:
    code, out = run(docker_client, standin_image, ["python", "-c", FIELDS_PROBE], stderr=False)
    assert code == 0, out[-3000:]
    version, fields = json.loads(out.strip().splitlines()[-1])
    code, out = run(docker_client, standin_image, ["python", "-m", "trainer", "config", "--json"],
                    {"TRAIN_GRAD_CKPT": "1", "TRAIN_OUTPUT_DIR": "/tmp/out"}, stderr=False)  # fmt: skip
    assert code == 0, out[-3000:]
    arguments = json.loads(out)["training_arguments"]
    renamed = tuple(int(n) for n in version.split(".")[:2]) >= (5, 18)  # trainer.compat's checkpointing_name
    name = "activation_checkpointing" if renamed else "gradient_checkpointing"
    assert arguments[name] is True and set(arguments) <= set(fields)


def test_each_unsupported_switch_exits_2_with_the_reason(standin_image: str, standin_row: str, docker_client) -> None:
    unsupported = ROWS[standin_row].unsupported
    if not unsupported:
        pytest.skip(f"the {standin_row} row's stack runs every switch")
    for switch in unsupported:
        name, _, value = switch.partition("=")
        env = {name: value, "TRAIN_OUTPUT_DIR": "/tmp/out"}
        code, out = run(docker_client, standin_image, ["python", "-m", "trainer", "config"], env)
        assert code == 2, out[-3000:]
        assert f"{switch} is not supported on " in out and "Traceback" not in out


def test_tiny_trains_and_a_sigterm_checkpoint_resumes_bit_exactly(
    standin_image: str, docker_client, tmp_path: Path
) -> None:
    reference, out = tmp_path / "reference", tmp_path / "out"
    reference.mkdir()
    out.mkdir()
    code, logs = run(docker_client, standin_image, ["train"], TINY, reference)
    assert code == 0, logs[-4000:]
    assert steps(reference) == list(range(1, 9))

    container = docker_client.containers.run(standin_image, ["train"], environment=TINY, detach=True,
                                             user=f"{os.getuid()}:{os.getgid()}",
                                             volumes={str(out): {"bind": "/output", "mode": "rw"}})  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while 2 not in steps(out):
            container.reload()
            assert container.status != "exited" and time.monotonic() < deadline, container.logs().decode()[-4000:]
            time.sleep(0.05)
        container.kill(signal="SIGTERM")  # what `docker stop` sends
        status = container.wait(timeout=300)
        logs = container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)
    assert status["StatusCode"] == 143 and "interrupted by SIGTERM" in logs, logs[-4000:]
    assert any(out.glob("checkpoint-*/trainkit_complete"))

    code, logs = run(docker_client, standin_image, ["train"], TINY, out)
    assert code == 0 and "continuing from /output/checkpoint-" in logs, logs[-4000:]
    assert steps(out) == list(range(1, 9))
    assert same_weights(out / "final", reference / "final")
