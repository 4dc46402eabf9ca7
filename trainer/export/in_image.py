"""What a trainkit image's build says of export's tools: inside an image whose build left a tool out (its build
manifest's claim: skipped, with the reason), `export --quant` refuses naming the image's row and that reason, as the
image's label does, instead of failing in the tool. Outside an image neither file exists."""

from __future__ import annotations

import json

from trainer import provenance

CARRIER = "the CPU image, trainkit:latest-cpu, carries it"  # what the suite builds and proves with both tools


def refusal(piece: str, types: list[str], tool: str, label: str, host_hint: str) -> str | None:
    """Inside an image without `piece` (a build-manifest claim: llama_cpp, llmcompressor): the message naming its row,
    why the build left `tool` out, and where to export instead. None outside an image, or where the image carries it."""
    try:
        manifest = json.loads(provenance.MANIFEST_FILE.read_text())
    except (OSError, ValueError):
        return None
    claim = manifest.get("extensions", {}).get(piece) or {}
    if claim.get("status") == "built":
        return None
    reason = claim.get("reason") or f"its build predates {tool} in the images"
    return (f"export --quant {','.join(types)}: {_row_name()} carries no {tool}: {reason}. Export these types with "
            f"an image whose label {label} says accepted ({CARRIER}), or on the host: {host_hint}")


def _row_name() -> str:
    try:
        row = str(json.loads(provenance.BUILD_FILE.read_text()).get("org.trainkit.row") or "")
    except (OSError, ValueError):
        row = ""
    names = {"": "this image", "cpu": "the CPU flavor", "rl": "the online-RL row",
             "cpu-rl": "the CPU flavor's online-RL image"}  # fmt: skip
    return names.get(row, f"the CUDA {row} row")
