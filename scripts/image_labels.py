"""Labels that tell the truth: after the build, each pin label names the version read inside the image (or
`skipped: <reason>` from the build manifest), and the labels compose adds to every image it builds
(com.docker.compose.project/.service/.version) are dropped.

Compose has no switch to leave its labels out, and a Dockerfile LABEL cannot remove one, so the image's config is
rewritten with the final labels and loaded back: a `docker load` archive holding the new config and no layer data
(the engine already has every layer, and a load skips the layers it has). The layers stay the same bytes; only the
image id changes.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import re
import sys
import tarfile

import docker
from errors import UserError

PIN = "org.trainkit.pin."
APEX = "org.trainkit.apex-ref"
GGUF = "org.trainkit.gguf-export"  # export --quant's GGUF types: accepted (llama.cpp in the image) or refused, why
COMPRESSED = "org.trainkit.compressed-export"  # export --quant fp8/w4a16: accepted (llmcompressor's overlay) or refused
FOREIGN = ("com.docker.compose.",)  # labels our builder's tools add, which say nothing about the image
METADATA_STEP = re.compile(r"^(/bin/sh -c #\(nop\) )?(ENV|LABEL|ARG|CMD|ENTRYPOINT|SHELL|USER|EXPOSE|VOLUME|"
                           r"STOPSIGNAL|HEALTHCHECK|ONBUILD|MAINTAINER)\b")  # fmt: skip


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _skip_reason(extensions: dict, package: str) -> str | None:
    claim = extensions.get(package.replace("-", "_")) or {}
    return claim.get("reason") if claim.get("status") == "skipped" else None


def truthful(planned: dict[str, str], inside: dict) -> dict[str, str]:
    """`planned` with every pin label and the apex label set from what the image holds (`inside`: verify.py's
    report), and no label of the build tools."""
    extensions = inside["manifest"].get("extensions", {})
    installed = {normalized(k): v for k, v in {**inside.get("packages", {}), **inside["versions"]}.items()}
    out = {k: v for k, v in planned.items() if not k.startswith(FOREIGN)}
    for key in [k for k in out if k.startswith(PIN)]:
        package = key.removeprefix(PIN)
        reason = _skip_reason(extensions, package)
        out[key] = f"skipped: {reason}" if reason else installed.get(normalized(package), "not installed")
    apex = extensions.get("apex", {})
    if apex.get("status") == "skipped":
        out[APEX] = f"skipped: {apex.get('reason', '')}"
    elif apex.get("status") == "kept":
        out[APEX] = f"base image's apex {installed.get('apex', '(version unknown)')}"
    elif apex.get("status") != "built":
        out.pop(APEX, None)
    for label, (piece, _, _) in EXPORT_TOOLS.items():
        out[label] = export_label(label, extensions.get(piece))
    return out


# An export label's claim, tool and what an accepting image says ({version}: the claim's)
EXPORT_TOOLS = {
    GGUF: ("llama_cpp", "llama.cpp", "GGUF types through llama.cpp (llama-cpp-python {version}: converter, quantizer, "
           "runtime), proven in the build by exporting a two-layer model to q8_0 and scoring it in llama.cpp"),
    COMPRESSED: ("llmcompressor", "llmcompressor", "fp8 and w4a16 through llmcompressor {version} (compressed-tensors, "
                 "scored in Transformers' loader), proven in the build by exporting a two-layer model to fp8 and "
                 "scoring it"),
}  # fmt: skip


def export_label(label: str, claim: dict | None) -> str:
    """`label` (GGUF, COMPRESSED) from the build manifest's claim of its tool: accepted where images/verify.py proved
    it by an export inside the image, else refused with the build's reason."""
    piece, tool, accepted = EXPORT_TOOLS[label]
    if not claim:
        return f"refused: this image was built without {tool} (no {piece} claim in its build manifest)"
    if claim.get("status") == "skipped":
        return f"refused: {claim.get('reason', '')}"
    return "accepted: " + accepted.format(version=claim.get("version"))


def _history(client: docker.DockerClient, image_id: str, layers: int) -> list[dict]:
    """The image's history, oldest first, with exactly as many non-empty steps as it has layers at most."""
    steps = list(reversed(client.api.history(image_id)))
    sized = sum(1 for s in steps if s["Size"] > 0)
    spare = layers - sized  # layers of zero bytes (a WORKDIR, an empty folder): given to steps that make layers
    out = []
    for step in steps:
        empty = step["Size"] == 0
        if empty and spare > 0 and not METADATA_STEP.match(step.get("CreatedBy", "")):
            empty, spare = False, spare - 1
        entry = {"created": dt.datetime.fromtimestamp(step["Created"], dt.timezone.utc).isoformat(),
                 "created_by": step.get("CreatedBy", "")}  # fmt: skip
        if step.get("Comment"):
            entry["comment"] = step["Comment"]
        if empty:
            entry["empty_layer"] = True
        out.append(entry)
    return out


def relabel(client: docker.DockerClient, image: str, labels: dict[str, str], tags: list[str]) -> str:
    """Give `image` exactly `labels` under `tags`; return the new image id."""
    attrs = client.api.inspect_image(image)
    layers = attrs["RootFS"]["Layers"]
    config = {
        "architecture": attrs["Architecture"],
        "os": attrs["Os"],
        "created": attrs["Created"],
        "config": {**attrs["Config"], "Labels": labels},
        "rootfs": {"type": "layers", "diff_ids": layers},
        "history": _history(client, attrs["Id"], len(layers)),
    }
    if attrs.get("Variant"):
        config["variant"] = attrs["Variant"]
    blob = json.dumps(config, separators=(",", ":")).encode()
    manifest = [{"Config": "config.json", "RepoTags": tags, "Layers": [f"layer-{i}.tar" for i in range(len(layers))]}]
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for name, data in (("config.json", blob), ("manifest.json", json.dumps(manifest).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    try:
        client.images.load(archive.getvalue())
    except docker.errors.APIError as exc:  # an engine that needs the layer data (containerd's image store)
        return _relabel_on_top(client, attrs["Id"], labels, tags, str(exc.explanation or exc))
    new_id = client.images.get(tags[0]).id
    if new_id != attrs["Id"]:
        with contextlib.suppress(docker.errors.APIError):  # the untagged pre-label config; its layers stay
            client.images.remove(attrs["Id"], noprune=True)
    return new_id


def _relabel_on_top(client: docker.DockerClient, image_id: str, labels: dict[str, str], tags: list[str],
                    why: str) -> str:  # fmt: skip
    """The fallback: the final values set by a LABEL-only build on top (no new layer); a label cannot be removed
    that way, so the build tools' labels stay, and the build says so."""
    try:
        image, _ = client.images.build(fileobj=io.BytesIO(f"FROM {image_id}\n".encode()), labels=labels, rm=True)
    except (docker.errors.APIError, docker.errors.BuildError) as exc:
        raise UserError(f"could not set the final labels ({why}; then {exc})") from None
    for tag in tags:
        image.tag(*tag.rsplit(":", 1))
    print(
        f"warning: this engine could not load a relabelled config ({why}); the labels name what is inside, but "
        "compose's own labels (com.docker.compose.*) remain",
        file=sys.stderr,
    )
    return image.id
