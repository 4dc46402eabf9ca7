"""llama.cpp in the images (issue 56, item 5), without an engine: which rows can carry the converter (gguf-py's own
requirements, read from the pinned sdist), when the build takes the host's wheel instead of compiling it, the label,
and the trainer's refusal in an image without llama.cpp."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import image_labels  # noqa: E402
import setup_llama_cpp  # noqa: E402
from conftest import inside_an_image  # noqa: E402
from matrix import load  # noqa: E402

from trainer import provenance  # noqa: E402
from trainer.errors import ConfigError  # noqa: E402
from trainer.export import gguf  # noqa: E402

PINS = load().llama_cpp


@pytest.fixture(scope="module")
def converter() -> Path:
    """The pinned llama.cpp's converter folder (scripts/setup_llama_cpp.py: seconds once built)."""
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "setup_llama_cpp.py")], capture_output=True,
                            text=True, timeout=3600, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return Path(result.stdout.strip().splitlines()[-1])


def test_rows_with_numpy_1_cannot_carry_the_converter(converter: Path) -> None:
    """gguf-py (the converter's package) asks for numpy >= 2.2.6: NGC 23.07 to 24.12 ship NumPy 1.26, which their
    compiled packages are built against, so those rows refuse --quant; NumPy 2.2.6 rows and Python 3.10 carry it."""
    facts = {"python": "3.12", "glibc": "2.39", "machine": "x86_64", "numpy": "1.26.4"}
    problem = setup_llama_cpp.carry_problem(converter, facts, PINS["version"])
    assert problem is not None and "numpy >= 2.2.6" in problem and "numpy 1.26.4" in problem
    assert setup_llama_cpp.carry_problem(converter, {**facts, "numpy": "2.2.6"}, PINS["version"]) is None
    assert setup_llama_cpp.carry_problem(converter, {**facts, "numpy": "2.2.6", "python": "3.10"}, "x") is None
    old = setup_llama_cpp.carry_problem(converter, {**facts, "numpy": "2.2.6", "python": "3.9"}, PINS["version"])
    assert old is not None and "Python >= 3.10" in old


def _host_wheel(folder: Path, **stamp: str) -> Path:
    folder.mkdir()
    wheel = folder / f"llama_cpp_python-{PINS['version']}-py3-none-linux_x86_64.whl"
    wheel.write_bytes(b"a wheel")
    facts = {"version": PINS["version"], "sdist_sha256": PINS["sdist_sha256"], "cmake_args": PINS["cmake_args"],
             "recipe": setup_llama_cpp.build_recipe(PINS["cmake_args"]), "python": "3.11", "machine": "x86_64",
             "glibc": "2.36", "wheel": wheel.name,
             "wheel_sha256": setup_llama_cpp.sha256(wheel)}  # fmt: skip
    (folder / "build.json").write_text(json.dumps({**facts, **stamp}))
    return wheel


def test_the_build_takes_the_host_wheel_only_when_it_matches(tmp_path: Path) -> None:
    image = {"python": "3.11", "glibc": "2.36", "machine": "x86_64", "numpy": "2.2.6"}
    wheel = _host_wheel(tmp_path / "same")
    assert setup_llama_cpp._prebuilt(tmp_path / "same", PINS, image)[0] == wheel
    _host_wheel(tmp_path / "native", cmake_args="-DLLAVA_BUILD=OFF")  # a -march=native build: not for an image
    taken, why = setup_llama_cpp._prebuilt(tmp_path / "native", PINS, image)
    assert taken is None and "cmake_args '-DLLAVA_BUILD=OFF'" in why
    _host_wheel(tmp_path / "ubuntu")
    taken, why = setup_llama_cpp._prebuilt(tmp_path / "ubuntu", PINS, {**image, "glibc": "2.39"})
    assert taken is None and "glibc '2.36', not '2.39'" in why
    _host_wheel(tmp_path / "altered", wheel_sha256="0" * 64)
    taken, why = setup_llama_cpp._prebuilt(tmp_path / "altered", PINS, image)
    assert taken is None and "not the sha256" in why
    assert setup_llama_cpp._prebuilt(None, PINS, image) == (None, "no prebuilt wheel was given")


def test_the_label_says_whether_the_row_carries_it() -> None:
    def label(claim: dict | None) -> str:
        return image_labels.export_label(image_labels.GGUF, claim)

    assert label({"status": "skipped", "reason": "numpy 1.26.4"}) == "refused: numpy 1.26.4"
    accepted = label({"status": "built", "version": PINS["version"]})
    assert accepted.startswith(f"accepted: GGUF types through llama.cpp (llama-cpp-python {PINS['version']}")
    assert label(None).startswith("refused: this image was built without llama.cpp")


def test_an_image_without_llama_cpp_refuses_quant_naming_its_row(tmp_path: Path, monkeypatch) -> None:
    reason = "llama.cpp's converter (gguf-py, llama-cpp-python 0.3.36) needs numpy >= 2.2.6; this has 1.26.4"
    inside_an_image(tmp_path, monkeypatch, "llama_cpp", reason, "12.4")
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # the image's environment has no binding
    with pytest.raises(ConfigError) as refused:
        gguf.tools(["q8_0"])
    message = str(refused.value)
    assert message.startswith(f"export --quant q8_0: the CUDA 12.4 row carries no llama.cpp: {reason}")
    assert "org.trainkit.gguf-export" in message
    monkeypatch.setattr(provenance, "MANIFEST_FILE", tmp_path / "absent.json")  # outside an image: the host's hint
    with pytest.raises(ConfigError, match="llama-cpp-python is not installed; install it with"):
        gguf.tools(["q8_0"])
