"""The CUDA build path for real, on stand-in bases (no NGC, no GPU): `build.py --cuda X.Y --standin --arch-list 9.0`.

Each row (12.1 and 12.8 by default; every row with `pytest --all-rows`) is built once per session by the
`standin_image` fixture: the real Dockerfile on a base made from packages, DeepSpeed compiled for CUDA, verify.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "build" / "records"
RL_ROW = "rl"  # the online-RL row's stand-in (`build.py --rl --standin`; tests/conftest.py builds it)


def row_slug(row: str) -> str:
    """What the stand-in's tags and record name the row by (tests/conftest.py's rule): cu128, or rl."""
    return row if row == RL_ROW else "cu" + row.replace(".", "")


def run_in(client, image: str, command: str) -> str:
    """Output of `sh -c command` in a throwaway container (the entrypoint bypassed)."""
    return client.containers.run(image, ["-c", command], entrypoint="sh", remove=True, stdout=True,
                                 stderr=True).decode()  # fmt: skip


def record(row: str) -> dict:
    path = RECORDS / f"trainkit_0.1.0-{row_slug(row)}-standin.json"
    assert path.is_file(), f"no build record at {path}"
    return json.loads(path.read_text())


def cuda_major(row: str) -> str:
    """The CUDA major of the row's stand-in torch (the online-RL row's: CUDA 13)."""
    return "13" if row == RL_ROW else row.split(".")[0]


def test_tags_labels_and_record_say_stand_in(standin_image: str, standin_row: str, docker_client) -> None:
    image = docker_client.images.get(standin_image)
    xy = row_slug(standin_row)
    assert f"trainkit:0.1.0-{xy}-standin" in image.tags
    assert not [t for t in image.tags if "ngc" in t]
    labels = image.labels
    assert labels["org.trainkit.standin"] == "true"
    assert labels["org.trainkit.ngc"] == "none"
    assert "stand-in base, not NGC" in labels["org.opencontainers.image.description"]
    assert labels["org.trainkit.arch-list"] == "9.0"
    rec = record(standin_row)
    assert rec["plan"]["standin"] is True
    assert rec["image"]["id"] == image.id
    assert rec["base"]["image"].startswith(f"trainkit-base:standin-{xy}-")
    base_labels = docker_client.images.get(rec["base"]["id"]).labels
    assert base_labels["org.trainkit.standin"] == "true"
    assert {"base_s", "build_s", "verify_s", "total_s"} <= set(rec["durations"])


def test_verify_passed_with_cuda_ops_sass_and_bitsandbytes(standin_row: str, standin_image: str) -> None:
    checks = {c["name"]: c for c in record(standin_row)["checks"]}
    assert all(c["status"] in ("ok", "skipped") for c in checks.values()), checks
    assert checks["deepspeed:accelerator"] == {"name": "deepspeed:accelerator", "status": "ok",
                                               "detail": "ops compiled for cuda"}  # fmt: skip
    for op in ("cpu_adam", "fused_adam", "async_io", "pin_memory"):
        assert checks[f"deepspeed:{op}"]["status"] == "ok", checks[f"deepspeed:{op}"]
    assert "SASS sm_90" in checks["deepspeed:fused_adam"]["detail"]
    assert checks["bitsandbytes:cuda"]["status"] == "ok"
    # The library for the base torch's CUDA, whose major is the row's (cuda12x for 12.x rows, cuda130 for 13.0).
    assert checks["bitsandbytes:cuda"]["detail"].startswith(f"libbitsandbytes_cuda{cuda_major(standin_row)}")


def test_deepspeed_inside_is_built_for_cuda_with_fused_adam(standin_image: str, docker_client) -> None:
    probe = ("from deepspeed import git_version_info as g; ops = g.installed_ops; "
             "print(g.accelerator_name, bool(ops['fused_adam']), bool(ops['cpu_adam']))")  # fmt: skip
    assert run_in(docker_client, standin_image, f'python -c "{probe}"').split()[-3:] == ["cuda", "True", "True"]
    # fused_adam's shared object holds sm_90 machine code (the toolkit's own cuobjdump reads it).
    so = run_in(docker_client, standin_image,
                "ls /usr/local/lib/python3*/dist-packages/deepspeed/ops/adam/fused_adam_op*.so").strip()
    listing = run_in(docker_client, standin_image, f"/usr/local/cuda/bin/cuobjdump --list-elf {so}")
    assert ".sm_90.cubin" in listing


def test_apex_and_flash_attn_are_skipped_with_reasons(standin_row: str, standin_image: str) -> None:
    extensions = record(standin_row)["manifest"]["extensions"]
    apex = extensions["apex"]
    assert apex["status"] == "skipped"
    assert "apex source not fetched from https://github.com/NVIDIA/apex.git" in apex["reason"]
    assert extensions["flash_attn"]["status"] == "skipped"
    assert extensions["flash_attn"]["reason"]


def test_the_image_owns_its_constraints(standin_row: str, standin_image: str, docker_client) -> None:
    constraints = run_in(docker_client, standin_image, "echo $PIP_CONSTRAINT; cat $PIP_CONSTRAINT")
    lines = constraints.splitlines()
    assert lines[0] == "/etc/trainkit/constraints.txt"
    # The distribution's version: PyPI's wheels say 2.1.2 where torch.__version__ says 2.1.2+cu121.
    probe = "python -c 'import importlib.metadata as m; print(m.version(\"torch\"))'"
    assert f"torch=={run_in(docker_client, standin_image, probe).strip()}" in lines
    assert any(line.startswith(f"nvidia-cudnn-cu{cuda_major(standin_row)}==") for line in lines)
    assert any(line.startswith("numpy==") for line in lines)
    assert not [line for line in lines if line.startswith(("pyarrow", "dill", "fsspec=="))]


def test_12_8_builds_datasets_5_2_over_the_bases_pyarrow_19_pin(standin_default: str, docker_client) -> None:
    """NGC 25.03's constraint file pins RAPIDS' pyarrow 19; the stand-in reproduces it, datasets 5.2 needs >= 24."""
    rec = record("12.8")
    base_pins = run_in(docker_client, rec["base"]["id"], "echo $PIP_CONSTRAINT; cat /etc/pip/constraint.txt")
    assert base_pins.splitlines()[0] == "/etc/pip/constraint.txt"
    assert "pyarrow==19.0.1" in base_pins.splitlines()
    assert rec["versions_inside"]["datasets"] == "5.2.0"
    pyarrow = run_in(docker_client, standin_default, "python -c 'import pyarrow; print(pyarrow.__version__)'")
    assert int(pyarrow.strip().split(".")[0]) >= 24


def test_the_vllm_row_passes_the_canary_at_build_time(standin_row: str, standin_image: str,
                                                                    docker_client) -> None:
    """The canary (images/vllm_canary.py) ran in the build's verify step and passed; the labels say what the row
    does; vLLM, its torch and transformers are the ones the row names."""
    if standin_row != RL_ROW:
        pytest.skip("the online-RL row's check")
    rec = record(standin_row)
    checks = {c["name"]: c for c in rec["checks"]}
    assert checks["trl:vllm"]["status"] == "ok", checks["trl:vllm"]
    assert "TRL 1.16.0's vLLM path imports against vLLM 0.31.0" in checks["trl:vllm"]["detail"]
    labels = docker_client.images.get(standin_image).labels
    assert labels["org.trainkit.row"] == RL_ROW
    assert labels["org.trainkit.vllm-server-mode"].startswith("accepted: colocate and server mode (vLLM 0.31.0")
    inside = rec["versions_inside"]
    assert (inside["vllm"], inside["transformers"], inside["trl"]) == ("0.31.0", "5.17.0", "1.16.0")
    assert inside["torch"].startswith("2.13.0")
