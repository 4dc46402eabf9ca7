"""build.py's stand-in plan: no Docker engine needed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = tomllib.loads((ROOT / "images" / "versions.toml").read_text())
NO_ENGINE = {**os.environ, "DOCKER_HOST": "tcp://127.0.0.1:9"}
CUDA_STANDINS = [row for row in VERSIONS["standin"] if row in VERSIONS["cuda"]]  # the online-RL row's is "rl"


def build_py(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "build.py"), *args], capture_output=True,
                          text=True, timeout=60, cwd=ROOT, env=NO_ENGINE)  # fmt: skip


@pytest.mark.parametrize("cuda", CUDA_STANDINS)
def test_standin_plan_names_the_local_base_and_standin_tags(cuda: str) -> None:
    proc = build_py("--cuda", cuda, "--standin", "--arch-list", "9.0", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    xy = cuda.replace(".", "")
    standin = VERSIONS["standin"][cuda]
    assert f"CUDA {cuda} (stand-in base)" in proc.stdout
    assert f"base:    trainkit-base:standin-cu{xy}-torch{standin['torch']}-" in proc.stdout
    assert f"tags:    trainkit:0.1.0-cu{xy}-standin, trainkit:latest-cu{xy}-standin" in proc.stdout
    assert "arch:    9.0" in proc.stdout
    assert "nvcr.io" not in proc.stdout and "-ngc" not in proc.stdout
    assert f"stand-in for NGC {VERSIONS['cuda'][cuda]['ngc']}, not NGC" in proc.stdout


def test_standin_base_tag_changes_with_its_inputs(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    import matrix
    import standin_base

    entry = matrix.load().entry("12.8")
    text = (ROOT / "images" / "versions.toml").read_text()
    changed = tmp_path / "versions.toml"
    changed.write_text(text.replace('torch = "2.7.1"', 'torch = "2.7.0"'))
    before = standin_base.load_standin(entry)
    after = standin_base.load_standin(entry, changed)
    assert after.torch == "2.7.0"
    assert before.digest("trainkit-rootfs:bookworm") != after.digest("trainkit-rootfs:bookworm")


def test_all_standin_plans_cover_every_row_with_a_standin() -> None:
    proc = build_py("--all", "--standin", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("(stand-in base)") == len(VERSIONS["standin"])


@pytest.mark.parametrize("other", [["--ngc", "25.03"], ["--base", "x:y"]])
def test_standin_refuses_another_base(other: list[str]) -> None:
    proc = build_py("--cuda", "12.8", "--standin", *other, "--dry-run")
    assert proc.returncode == 2
    assert "--standin replaces the NGC base" in proc.stderr


def test_a_row_without_standin_inputs_is_a_user_error_naming_the_rows_that_have_them(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    import matrix
    import standin_base
    from errors import UserError

    text = (ROOT / "images" / "versions.toml").read_text()
    without = tmp_path / "versions.toml"
    without.write_text(text.replace('[standin."13.0"]', '[not_a_standin."13.0"]'))
    with pytest.raises(UserError) as err:
        standin_base.load_standin(matrix.load().entry("13.0"), without)
    rows = ", ".join(c for c in VERSIONS["standin"] if c != "13.0")
    assert f"CUDA 13.0 has no stand-in base; rows with one: {rows}" in str(err.value)


def _requirement_sets(cuda: str) -> tuple[list[str], list[str]]:
    """The trainer's requirements of row `cuda` resolved for the row's Python and for its stand-in's Python."""
    sys.path.insert(0, str(ROOT / "scripts"))
    sys.path.insert(0, str(ROOT / "images"))
    import matrix
    import standin_base
    import trainer_requirements

    loaded = matrix.load()
    entry = loaded.rl if cuda == matrix.RL_ROW else loaded.entry(cuda)
    pyproject, pins = str(ROOT / "pyproject.toml"), entry.packages
    standin = standin_base.load_standin(entry)
    return (trainer_requirements.requirements(pyproject, pins, entry.python),
            trainer_requirements.requirements(pyproject, pins, standin.python))  # fmt: skip


@pytest.mark.parametrize("cuda", list(VERSIONS["standin"]))
def test_each_standin_asks_for_its_rows_requirement_set(cuda: str) -> None:
    """A stand-in stands for its row: on its Python the trainer's requirements are the row's (12.1 on Debian's 3.11
    took TRL, which the row's 3.10 leaves out, and TRL 1.16 needs a datasets the row does not pin)."""
    on_row, on_standin = _requirement_sets(cuda)
    assert on_standin == on_row
    if VERSIONS["cuda"].get(cuda, VERSIONS.get("rl"))["python"] == "3.10":
        assert not [req for req in on_row if req.startswith("trl")]
        assert VERSIONS["standin"][cuda].get("rootfs"), "a 3.10 row's stand-in needs a root filesystem with 3.10"


def test_the_3_10_rows_standins_run_the_rows_python_and_the_plan_says_so() -> None:
    proc = build_py("--cuda", "12.1", "--standin", "--arch-list", "9.0", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "  python:  3.10\n" in proc.stdout
    assert "the jammy root filesystem's Python 3.10" in proc.stdout
    rootfs = VERSIONS["standin_rootfs"][VERSIONS["standin"]["12.1"]["rootfs"]]
    assert rootfs["python"] == VERSIONS["cuda"]["12.1"]["python"]


def test_a_standin_on_another_python_says_which_python_its_requirements_are_for() -> None:
    proc = build_py("--cuda", "12.8", "--standin", "--arch-list", "9.0", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    python = VERSIONS["cuda"]["12.8"]["python"]
    assert f"  python:  {VERSIONS['cpu']['python']} (requirements for the row's {python})" in proc.stdout
    assert f"the trainer's requirements are resolved for {python}" in proc.stdout


def trainer_requirements_cli(row: str, pins: str, standin: bool) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRAINKIT_STANDIN": "1" if standin else ""}
    argv = [sys.executable, str(ROOT / "images" / "trainer_requirements.py"), str(ROOT / "pyproject.toml"), pins, row]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)


def _pins(cuda: str) -> str:
    sys.path.insert(0, str(ROOT / "scripts"))
    import matrix

    return matrix.trainer_pins(matrix.load().entry(cuda).packages)


def test_the_image_build_refuses_a_python_that_asks_for_another_requirement_set() -> None:
    """The build-time check (images/trainer_requirements.py in the Dockerfile): run here on this Python (3.11+, TRL
    asked for), a 3.10 row's stand-in fails naming TRL and the fix, before pip resolves anything."""
    if sys.version_info < (3, 11):
        pytest.skip("needs a Python on which pyproject asks for TRL")
    proc = trainer_requirements_cli("3.10", _pins("12.1"), standin=True)
    assert proc.returncode == 1
    assert "the row's is 3.10, and the trainer's requirements differ" in proc.stderr
    assert "trl==1.16.0" in proc.stderr and "[standin_rootfs]" in proc.stderr


def test_the_image_build_refuses_an_ngc_base_whose_python_is_not_the_rows() -> None:
    running = f"{sys.version_info[0]}.{sys.version_info[1]}"
    other = "3.99"
    proc = trainer_requirements_cli(other, _pins("12.8"), standin=False)
    assert proc.returncode == 1
    assert f"the base runs Python {running}, but images/versions.toml says the row's is {other}" in proc.stderr


def test_the_rows_own_python_gets_marker_free_requirements_resolved_for_it() -> None:
    running = f"{sys.version_info[0]}.{sys.version_info[1]}"
    proc = trainer_requirements_cli(running, _pins("12.8"), standin=False)
    assert proc.returncode == 0, proc.stderr
    assert f"Python {running}, the row's" in proc.stderr
    assert ";" not in proc.stdout  # markers evaluated for the row's Python, not left to the image's pip
    if sys.version_info >= (3, 11):
        assert [line for line in proc.stdout.splitlines() if line.startswith("trl")]
    # A stand-in on this Python for a row whose Python asks for the same set: built, the difference said.
    proc = trainer_requirements_cli("3.99", _pins("12.8"), standin=True)
    assert proc.returncode == 0, proc.stderr
    assert f"stand-in runs Python {running}, not the row's 3.99" in proc.stderr


def test_the_online_rl_standin_is_pypis_vllm_on_the_torch_it_pins() -> None:
    """`--rl --standin`: PyPI's vllm 0.31.0 (the vLLM image's release) on the torch its wheel pins (2.13.0, the 13.3
    stand-in's), never tagged as the vLLM image."""
    proc = build_py("--rl", "--standin", "--arch-list", "9.0", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    standin = VERSIONS["standin"]["rl"]
    assert "vllm==0.31.0" in standin["packages"] and standin["torch"] == VERSIONS["vllm"]["torch_pins"]["0.31.0"]
    assert f"base:    trainkit-base:standin-rl-cu134-torch{standin['torch']}-" in proc.stdout
    assert "tags:    trainkit:0.1.0-rl-standin, trainkit:latest-rl-standin" in proc.stdout
    assert f"stand-in for {VERSIONS['vllm']['server_image']}, not NGC" in proc.stdout
    assert "vllm==0.31.0 from PyPI" in proc.stdout
    assert "TRAIN_RL_ENGINE=vllm accepted: colocate and server mode (vLLM 0.31.0" in proc.stdout
    assert "transformers==5.17.0" in proc.stdout
    assert "nvcr.io" not in proc.stdout.split("note:")[0]  # the base and tags: local


def test_all_standins_include_the_online_rl_row_and_the_new_cuda_rows() -> None:
    proc = build_py("--all", "--standin", "--arch-list", "9.0", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    for row in ("13.1", "13.2", "13.3"):
        assert f"plan: trainkit 0.1.0, CUDA {row} (stand-in base)" in proc.stdout
    assert "tags:    trainkit:0.1.0-rl-standin" in proc.stdout
