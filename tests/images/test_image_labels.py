"""Labels that tell the truth (scripts/image_labels.py): the version read inside or `skipped: <reason>` for each
pin, and the build tools' own labels dropped by rewriting the image config (layers untouched)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import image_labels  # noqa: E402
from buildkit import BuildSpec, run_build  # noqa: E402

PLANNED = {"org.opencontainers.image.title": "trainkit", "org.trainkit.pin.flash-attn": "2.8.3.post2",
           "org.trainkit.pin.transformers": "5.23.0", "org.trainkit.pin.huggingface-hub": "2.4.0",
           "org.trainkit.apex-ref": "10417aceddd7d5d05d7cbf7b0fc2daad1105f8b4",
           "com.docker.compose.project": "trainkit-build"}  # fmt: skip


def test_a_standin_report_labels_skipped_pieces_with_their_reason() -> None:
    """What a stand-in build reports (no flash-attn wheel, source builds off; apex not fetched): its labels say so."""
    no_wheel = "no usable prebuilt wheel (offline), and source builds are off (FLASH_ATTN_SOURCE_BUILD=0)"
    inside = {
        "manifest": {"extensions": {"flash_attn": {"status": "skipped", "reason": no_wheel},
                                    "apex": {"status": "skipped", "reason": "apex source not fetched"}}},
        "versions": {"transformers": "5.23.0", "torch": "2.7.0+cu128"},
        "packages": {"huggingface_hub": "2.4.0", "transformers": "5.23.0"},
    }  # fmt: skip
    labels = image_labels.truthful(PLANNED, inside)
    assert labels["org.trainkit.pin.flash-attn"] == f"skipped: {no_wheel}"
    assert labels["org.trainkit.apex-ref"] == "skipped: apex source not fetched"
    assert labels["org.trainkit.pin.huggingface-hub"] == "2.4.0"  # read inside, names normalized
    assert "com.docker.compose.project" not in labels


def test_pieces_kept_from_the_base_or_missing_say_so() -> None:
    inside = {"manifest": {"extensions": {"apex": {"status": "kept", "source": "base image"},
                                          "flash_attn": {"status": "kept", "source": "base image"}}},
              "versions": {"apex": "0.1", "flash-attn": "2.4.2"}, "packages": {}}  # fmt: skip
    labels = image_labels.truthful(PLANNED, inside)
    assert labels["org.trainkit.apex-ref"] == "base image's apex 0.1"
    assert labels["org.trainkit.pin.flash-attn"] == "2.4.2"  # the base's, not the planned 2.8.3.post2
    assert labels["org.trainkit.pin.huggingface-hub"] == "not installed"


@pytest.mark.docker
def test_relabel_drops_compose_labels_and_keeps_the_layers(docker_client, cpu_image: str, tmp_path: Path) -> None:
    """A small image built through compose (as every build here is) carries compose's labels; relabel leaves only
    ours, on the same layers, and the image still runs and shows its history."""
    steps = ["USER 0", "RUN mkdir -p /relabel && echo hi > /relabel/x", "WORKDIR /relabel/empty", "ENV RELABEL=1"]
    (tmp_path / "Dockerfile").write_text("\n".join([f"FROM {cpu_image}", *steps, ""]))  # USER 0: the image runs as 1000
    tags = ["trainkit-test:relabel", "trainkit-test:relabel-2"]
    run_build(BuildSpec(context=tmp_path, dockerfile=tmp_path / "Dockerfile", tags=tags, labels={"a.b": "c"}))
    try:
        before = docker_client.api.inspect_image(tags[0])
        assert "com.docker.compose.project" in before["Config"]["Labels"]  # what compose adds by itself
        wanted = {k: v for k, v in before["Config"]["Labels"].items() if not k.startswith("com.docker.compose.")}
        new_id = image_labels.relabel(docker_client, tags[0], wanted, tags)
        after = docker_client.api.inspect_image(tags[1])
        assert after["Id"] == new_id != before["Id"]
        assert after["Config"]["Labels"] == wanted and wanted["a.b"] == "c"
        assert after["RootFS"]["Layers"] == before["RootFS"]["Layers"]
        assert after["Config"]["Env"] == before["Config"]["Env"] and after["Config"]["WorkingDir"] == "/relabel/empty"
        assert len(docker_client.api.history(new_id)) == len(docker_client.api.history(cpu_image)) + len(steps)
        out = docker_client.containers.run(tags[0], ["-c", "cat /relabel/x; echo $RELABEL"], entrypoint="sh",
                                           remove=True).decode()  # fmt: skip
        assert out.split() == ["hi", "1"]
    finally:
        for tag in tags:
            docker_client.images.remove(tag, force=True)
