"""The 12.1 row's stack on the host (fast tier): transformers 4.46.3, torch 2.1.2 in `.venv-oldest`.

`bash tests/oldest/setup.sh` makes the venv (tests/run.sh does it); every trainer process here runs on its Python,
so a version difference the trainer does not handle (trainer/compat.py) fails here without building an image:
the tiny preset trains, a SIGTERM checkpoint resumes to identical weights, `config --json` speaks 4.46's argument
names, and every switch the row cannot run (scripts/matrix.py: compat's rules on the row's stack as
images/versions.toml gives it) exits 2 with its reason.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from train_runs import (
    MAX_STEPS,
    assert_same_weights,
    finish,
    global_step,
    logged_steps,
    train_env,
    write_corpus,
)
from waiting import wait_for

from trainer import compat

REPO = Path(__file__).resolve().parents[2]
OLDEST_PYTHON = REPO / ".venv-oldest" / "bin" / "python"
ROW = "12.1"
ROW_FACTS = tomllib.loads((REPO / "images" / "versions.toml").read_text())["cuda"][ROW]
sys.path.insert(0, str(REPO / "scripts"))
import matrix  # noqa: E402

REFUSED = matrix.load().entry(ROW).unsupported  # compat's rules on the row's stack as versions.toml gives it
ROW_NAME = "this stack (torch 2.1.2, transformers 4.46.3)"  # in NGC 23.07: "the CUDA 12.1 row (...)"

pytestmark = [
    pytest.mark.row_12_1,
    pytest.mark.skipif(not OLDEST_PYTHON.exists(), reason="no .venv-oldest: run `bash tests/oldest/setup.sh`"),
]


def run_oldest(argv: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`.venv-oldest/bin/python argv` in a clean environment (this tree on PYTHONPATH)."""
    base = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [str(OLDEST_PYTHON), *argv], env={**base, **env}, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def start_oldest(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(OLDEST_PYTHON), "-m", "trainer"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip


@pytest.fixture(scope="module")
def oldest_fields() -> set[str]:
    """The field names of transformers 4.46's TrainingArguments, from the class itself."""
    probe = "import dataclasses, json, transformers; print(json.dumps([f.name for f in dataclasses.fields(transformers.TrainingArguments)]))"  # noqa: E501
    result = run_oldest(["-c", probe], {})
    assert result.returncode == 0, result.stderr[-3000:]
    return set(json.loads(result.stdout.splitlines()[-1]))


def test_the_venv_holds_the_rows_pins() -> None:
    probe = "from importlib import metadata as m; print(*(m.version(p) for p in ('torch', 'transformers', 'accelerate', 'peft', 'datasets')))"  # noqa: E501
    found = run_oldest(["-c", probe], {}).stdout.split()
    pins = ROW_FACTS["packages"]
    assert found[0].startswith("2.1.")  # NGC 23.07's torch minor
    assert found[1:] == [pins["transformers"], pins["accelerate"], pins["peft"], pins["datasets"]]


def test_the_trainer_finds_the_rows_unsupported_switches_from_its_installed_versions() -> None:
    result = run_oldest(["-c", "import json; from trainer import compat; print(json.dumps(compat.unsupported()))"], {})
    assert result.returncode == 0, result.stderr[-3000:]
    assert set(json.loads(result.stdout)) == set(REFUSED)  # the row's described stack and its installed one agree


@pytest.mark.parametrize("switch", sorted(REFUSED))
def test_each_unsupported_switch_exits_2_with_the_reason_before_torch(switch: str, tmp_path: Path) -> None:
    name, _, value = switch.partition("=")
    env = {name: value, "TRAIN_OUTPUT_DIR": str(tmp_path / "out"), "HOME": str(tmp_path)}
    if switch == compat.IMAGES:  # a kind of data, not a value: records with images for the vision preset
        env |= {"TRAIN_DATA": str(image_records(tmp_path)), "TRAIN_MODEL": "tiny-vl"}
    result = run_oldest(["-X", "importtime", "-m", "trainer", "config"], env)
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"{switch} is not supported on {ROW_NAME}" in result.stderr
    assert "Traceback" not in result.stderr
    imported = {
        line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")
    }
    assert "torch" not in imported and "transformers" not in imported


def image_records(folder: Path) -> Path:
    """Two chat records in the messages layout, each asking about a picture beside them."""
    from PIL import Image

    Image.new("RGB", (28, 28), "red").save(folder / "red.png")
    record = {"messages": [{"role": "user", "content": [{"type": "image", "image": "red.png"},
                                                        {"type": "text", "text": "Which colour?"}]},
                           {"role": "assistant", "content": [{"type": "text", "text": "red"}]}]}  # fmt: skip
    data = folder / "pictures.jsonl"
    data.write_text((json.dumps(record) + "\n") * 2)
    return data


def test_doctor_shows_the_unsupported_switch(tmp_path: Path) -> None:
    env = {"TRAIN_ATTN": "flash_attention_2", "TRAIN_OUTPUT_DIR": str(tmp_path / "out"), "HOME": str(tmp_path)}
    result = run_oldest(["-m", "trainer", "doctor", "--json"], env)
    assert result.returncode == 2, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert any(f"TRAIN_ATTN=flash_attention_2 is not supported on {ROW_NAME}" in p for p in report["problems"])
    assert "flash-attn 2 needs torch >= 2.2" in report["config"]["error"]
    assert set(report["unsupported"]) == set(REFUSED)  # its own row, listed whatever is chosen


def test_config_json_uses_4_46_argument_names_and_4_46_accepts_them(oldest_fields: set[str], tmp_path: Path) -> None:
    env = {"TRAIN_GRAD_CKPT": "1", "TRAIN_OUTPUT_DIR": str(tmp_path / "out"), "HOME": str(tmp_path)}
    result = run_oldest(["-m", "trainer", "config", "--json"], env)
    assert result.returncode == 0, result.stderr[-3000:]
    arguments = json.loads(result.stdout)["training_arguments"]
    assert arguments["gradient_checkpointing"] is True  # 5.x: activation_checkpointing
    assert arguments["gradient_checkpointing_kwargs"] == {"use_reentrant": False}
    assert set(arguments) <= oldest_fields
    build = f"import json, transformers; transformers.TrainingArguments(**json.loads({json.dumps(arguments)!r}))"
    built = run_oldest(["-c", build], {"HOME": str(tmp_path)})
    assert built.returncode == 0, built.stderr[-3000:]


def test_fsdp_in_config_json_is_what_4_46_reads_as_auto_wrapped_layers(tmp_path: Path) -> None:
    """On 4.x `fsdp=True` + {version, reshard_after_forward} silently means one unit; 4.46 must parse a wrap policy."""
    env = {"TRAIN_FSDP": "hybrid_shard", "TRAIN_OUTPUT_DIR": str(tmp_path / "out"), "HOME": str(tmp_path)}
    result = run_oldest(["-m", "trainer", "config", "--json"], env)
    assert result.returncode == 0, result.stderr[-3000:]
    arguments = json.loads(result.stdout)["training_arguments"]
    parse = (
        f"import json, transformers; a = transformers.TrainingArguments(**json.loads({json.dumps(arguments)!r})); "
        "print(json.dumps([str(o.value) for o in a.fsdp] + a.fsdp_config['transformer_layer_cls_to_wrap']))"
    )
    parsed = run_oldest(["-c", parse], {"HOME": str(tmp_path)})
    assert parsed.returncode == 0, parsed.stderr[-3000:]
    assert json.loads(parsed.stdout.splitlines()[-1]) == ["hybrid_shard", "auto_wrap", "LlamaDecoderLayer"]


def test_fsdp1_arguments_are_4_x_words_not_5_x_config_keys() -> None:
    """On 4.x `fsdp=True` + {version, reshard_after_forward} silently means one unit: hybrid_shard must say so."""
    code = (
        "import json; from trainer import compat; "
        "print(json.dumps(compat.fsdp_arguments('hybrid_shard', 'LlamaDecoderLayer', True)))"
    )
    result = run_oldest(["-c", code], {})
    assert json.loads(result.stdout) == {
        "fsdp": "hybrid_shard auto_wrap",
        "fsdp_config": {"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"], "activation_checkpointing": True},
    }


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "data.txt")


def test_tiny_trains_and_a_sigterm_checkpoint_resumes_to_identical_weights(corpus: Path, tmp_path: Path) -> None:
    reference = tmp_path / "reference"
    code, err = finish(start_oldest(train_env(reference, data=corpus)))
    assert code == 0, err[-3000:]
    assert logged_steps(reference) == list(range(1, MAX_STEPS + 1))

    out = tmp_path / "out"
    env = train_env(out, data=corpus)
    proc = start_oldest(env)
    wait_for(lambda: 2 in logged_steps(out), 300, "step 2", proc=proc)
    os.killpg(proc.pid, signal.SIGTERM)
    code, err = finish(proc)
    assert code == 143 and "interrupted by SIGTERM" in err, err[-3000:]
    stopped = int(re.search(r"checkpoint-(\d+) written", err)[1])
    assert global_step(out / f"checkpoint-{stopped}") == stopped < MAX_STEPS

    code, err = finish(start_oldest(env))
    assert code == 0, err[-3000:]
    assert f"continuing from {out / f'checkpoint-{stopped}'}" in err
    assert_same_weights(out / "final", reference / "final")  # torch.equal, tensor by tensor


def test_fused_adamw_on_cpu_exits_2_with_the_reason(tmp_path: Path) -> None:
    """torch 2.1 has no CPU kernel for AdamW(fused=True): refused before training, not a crash in create_optimizer."""
    env = {"TRAIN_OPTIM": "adamw_torch_fused", "TRAIN_OUTPUT_DIR": str(tmp_path / "out"), "HOME": str(tmp_path)}
    result = run_oldest(["-m", "trainer"], env)
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"TRAIN_OPTIM=adamw_torch_fused on CPU is not supported on {ROW_NAME}" in result.stderr
    assert "Traceback" not in result.stderr
