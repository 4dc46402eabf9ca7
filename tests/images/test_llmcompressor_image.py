"""llmcompressor in the images (issue 56, item 5), without an engine: the build step's verdict where a row's
environment does not meet llmcompressor's requirements (a real install and probe, its claim, nothing left behind),
the label, and the trainer's refusal in an image without it. The CPU image's build proves the accepting path
(tests/images/test_cpu_image.py: an fp8 export inside the image)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import image_labels  # noqa: E402
import setup_quant  # noqa: E402
from conftest import inside_an_image  # noqa: E402
from matrix import dockerfile_defaults, load  # noqa: E402

from trainer import provenance  # noqa: E402
from trainer.errors import ConfigError  # noqa: E402
from trainer.export import compressed  # noqa: E402

PINS = load().llmcompressor


def test_a_row_whose_environment_does_not_fit_keeps_no_overlay_and_says_why(tmp_path: Path) -> None:
    """The image build's command (the Dockerfile's build args, --pins-from-env --claim) in an environment that lacks
    one of llmcompressor's requirements: auto-round, which the pins leave out, asked for here. The wheels are really
    installed and probed; the claim is skipped with the probe's words, the overlay removed, the build goes on."""
    args = dockerfile_defaults()
    env = {**os.environ, "LLMCOMPRESSOR_VERSION": args["LLMCOMPRESSOR_VERSION"],
           "LLMCOMPRESSOR_WHEELS": args["LLMCOMPRESSOR_WHEELS"], "LLMCOMPRESSOR_LEFT_OUT": ""}  # fmt: skip
    claim = tmp_path.parent / f"{tmp_path.name}-claims" / "llmcompressor.json"
    argv = [sys.executable, str(ROOT / "scripts" / "setup_quant.py"), "--pins-from-env", "--cache", str(tmp_path),
            "--claim", str(claim)]  # fmt: skip
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    written = json.loads(claim.read_text())
    assert written["status"] == "skipped" and written["version"] == PINS["version"]
    assert written["reason"].startswith(f"llmcompressor {PINS['version']} does not fit this environment: auto-round")
    assert "is not installed" in written["reason"]
    assert not tmp_path.exists()  # the cache folder held only the overlay: nothing of it is left in the image


def test_the_build_args_carry_the_pins_setup_quant_reads() -> None:
    wheels = setup_quant.build_arg_wheels(PINS["wheels"])
    env = {"LLMCOMPRESSOR_VERSION": PINS["version"], "LLMCOMPRESSOR_WHEELS": wheels, "LLMCOMPRESSOR_LEFT_OUT": "a b"}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        assert setup_quant._pins(from_env=True) == {**setup_quant._pins(from_env=False), "left_out": ["a", "b"]}
    assert dockerfile_defaults()["LLMCOMPRESSOR_WHEELS"] == wheels
    assert f'ARG LLMCOMPRESSOR_WHEELS="{wheels}"' in (ROOT / "Dockerfile").read_text()


def test_the_label_says_whether_the_row_carries_it() -> None:
    def label(claim: dict | None) -> str:
        return image_labels.export_label(image_labels.COMPRESSED, claim)

    reason = "llmcompressor 0.14.0.1 does not fit this environment: torch 2.7.0 is installed; llmcompressor asks x"
    assert label({"status": "skipped", "reason": reason}) == f"refused: {reason}"
    accepted = label({"status": "built", "version": PINS["version"]})
    assert accepted.startswith(f"accepted: fp8 and w4a16 through llmcompressor {PINS['version']}")
    assert label(None).startswith("refused: this image was built without llmcompressor")


def test_an_image_without_llmcompressor_refuses_fp8_naming_its_row(tmp_path: Path, monkeypatch) -> None:
    reason = "llmcompressor 0.14.0.1 does not fit this environment: torch 2.7.0a0 is installed; llmcompressor asks x"
    inside_an_image(tmp_path, monkeypatch, "llmcompressor", reason, "12.8")
    monkeypatch.setenv(compressed.OVERLAY_ENV, str(tmp_path / "absent" / "site"))  # the image's ENV, no overlay
    with pytest.raises(ConfigError) as refused:
        compressed.tools(["fp8"])
    message = str(refused.value)
    assert message.startswith(f"export --quant fp8: the CUDA 12.8 row carries no llmcompressor: {reason}")
    assert "org.trainkit.compressed-export says accepted" in message and "setup_quant.py" in message
    monkeypatch.setattr(provenance, "MANIFEST_FILE", tmp_path / "absent.json")  # outside an image: the host's hint
    with pytest.raises(ConfigError, match=r"llmcompressor is not installed .* install it with"):
        compressed.tools(["fp8"])
