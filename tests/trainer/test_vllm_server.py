"""TRAIN_RL_ENGINE=vllm: the version rule on real version strings, the rows of images/versions.toml, the
configuration check of this stack, and the TRL fields the engine sets.

No vLLM in this venv: the engine runs for real in the CPU RL venv (test_vllm_engine.py, bash tests/rl/run.sh).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import sys
from pathlib import Path

import pytest
import tomllib
from conftest import REPO

from trainer.vllm_compat import requirement_bounds, row_problem, server_mode_problem

VLLM = tomllib.loads((REPO / "images" / "versions.toml").read_text())["vllm"]
ROW = "the CUDA 13.0 row"


def test_the_recorded_range_is_the_installed_trls() -> None:
    """versions.toml's trl_range (what the server image is checked against) is what TRL's own `vllm` extra asks."""
    installed = requirement_bounds(importlib.metadata.requires("trl") or [], "vllm", "vllm")
    assert installed is not None and list(installed) == VLLM["trl_range"]


def test_the_rule_on_real_version_strings() -> None:
    trl = tuple(VLLM["trl_range"])
    assert requirement_bounds(["torch==2.11.0", "torchaudio==2.11.0"], "torch") == ("2.11.0", "2.11.0")
    ngc = "2.9.0a0+145a3a7bda.nv25.10"
    assert "has no vLLM installed" in server_mode_problem(trl, None, None, ngc, ROW)
    assert ROW in server_mode_problem(trl, None, None, ngc, ROW)
    assert "outside TRL's supported 0.22.0 to 0.31.0" in server_mode_problem(trl, "0.33.0", "2.13.0", "2.13.0", ROW)
    assert "outside" in server_mode_problem(trl, "0.21.0", "2.9.0", ngc, ROW)
    built_for = server_mode_problem(trl, "0.31.0", "2.13.0", ngc, ROW)
    assert "built for torch 2.13.0, beside torch 2.9.0a0" in built_for
    assert server_mode_problem(trl, "0.22.0+cu129", "2.11.0", "2.11.0a0+abc.nv26.03", ROW) is None
    assert "no TRL" in server_mode_problem(None, None, None, ngc, "the CUDA 12.4 row")


def test_every_row_of_this_release_is_refused_with_its_reason() -> None:
    rows = tomllib.loads((REPO / "images" / "versions.toml").read_text())
    pins, trl = VLLM["torch_pins"], VLLM["trl_range"]
    for cuda, row in rows["cuda"].items():
        has_trl = tuple(map(int, row["python"].split("."))) >= (3, 11)
        problem = row_problem(trl if has_trl else None, pins, row["torch"], f"the CUDA {cuda} row", cuda=True)
        if has_trl and any(t.split(".")[:2] == row["torch"].split(".")[:2] for t in pins.values()):
            assert problem is None, cuda  # 13.2 (torch 2.11) and 13.3 (2.13): a vLLM in TRL's range pins that minor
            continue
        assert problem and f"the CUDA {cuda} row" in problem
        assert ("no TRL" in problem) != has_trl and ("vLLM 0.22.0 pins torch 2.11.0" in problem) == has_trl
    cpu = row_problem(trl, pins, rows["cpu"]["torch"], "the CPU flavor", cuda=False)
    assert "has no CUDA" in cpu
    assert row_problem(trl, pins, "2.11.0a0+abc.nv26.03", "a row with torch 2.11", cuda=True) is None


def test_vllm_engine_exits_2_before_torch_naming_the_stack(tmp_path: Path, run_trainer, imported_modules) -> None:
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"prompt": "2+2=", "answer": "4"}) + "\n")
    env = {"TRAIN_DATA": str(data), "TRAIN_OUTPUT_DIR": str(tmp_path / "out"), "TRAIN_METHOD": "grpo",
           "TRAIN_REWARD": "exact", "TRAIN_RL_ENGINE": "vllm"}  # fmt: skip
    result = run_trainer(["config"], env=env, python_args=["-X", "importtime"])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "TRAIN_RL_ENGINE=vllm: this stack (torch" in result.stderr and "has no vLLM installed" in result.stderr
    assert "TRAIN_MODEL=tiny: vLLM loads the policy from a model folder" in result.stderr
    assert "torch" not in imported_modules(result.stderr)
    env.update(TRAIN_RL_ENGINE="transformers", TRAIN_RL_VLLM_URL="http://vllm:8000", TRAIN_RL_VLLM_TIMEOUT="60")
    result = run_trainer(["config"], env=env)
    assert result.returncode == 2, result.stderr
    assert "TRAIN_RL_VLLM_URL, TRAIN_RL_VLLM_TIMEOUT: for TRAIN_RL_ENGINE=vllm, not transformers" in result.stderr


def test_the_engine_sets_trls_server_mode_fields() -> None:
    """What GRPOConfig gets where the stack can run it: fields TRL 1.16 has, server mode, the URL."""
    from trl import GRPOConfig

    from trainer.config.online import method_arguments
    from trainer.config.parse import parse_settings

    settings = parse_settings({"TRAIN_METHOD": "grpo", "TRAIN_REWARD": "exact", "TRAIN_RL_ENGINE": "vllm",
                               "TRAIN_RL_VLLM_URL": "http://vllm:8000", "TRAIN_DATA": "/data"})  # fmt: skip
    args = method_arguments(settings)
    assert (args["use_vllm"], args["vllm_mode"], args["vllm_server_base_url"]) == (True, "server", "http://vllm:8000")
    assert args["vllm_server_timeout"] == 300 and set(args) <= {f.name for f in dataclasses.fields(GRPOConfig)}
    colocate = method_arguments(settings.model_copy(update={"rl_vllm_url": ""}))
    assert (colocate["vllm_mode"], colocate["vllm_gpu_memory_utilization"]) == ("colocate", 0.3)
    assert set(colocate) <= {f.name for f in dataclasses.fields(GRPOConfig)}
    assert method_arguments(settings.model_copy(update={"rl_engine": "transformers"}))["use_vllm"] is False


@pytest.mark.skipif(sys.platform != "linux", reason="reads the metadata of this Linux venv")
def test_this_stack_has_no_vllm_so_the_check_refuses() -> None:
    from trainer.compat import installed_version
    from trainer.vllm_compat import installed_problem

    assert installed_version("vllm") is None  # the day a vLLM is installed here, the config test above must change
    assert "has no vLLM installed" in installed_problem("this stack")
