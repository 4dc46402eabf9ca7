"""Which of OUT's artifacts an endpoint serves, from what /v1/models says of its model, and the agreement the export
measured for it (the bar its answers are held to: trainer/check/judge.py).

In order: the name `serve` gives it (OUT's folder name, NAME:TYPE for a quantized file; `ollama create NAME:TYPE`
gives the same); the path the server names (llama.cpp's model id is the file it loaded unless aliased, vLLM's `root`
the folder): one of OUT's artifacts, or a GGUF file whose sha256 OUT's provenance.json records, is identified; a GGUF
file whose sha256 is none of those is another model's file, named as such. Anything else is not identified.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer import provenance
from trainer.export.artifacts import ADAPTER, MODEL, Artifact, artifacts


@dataclass(frozen=True)
class Identity:
    artifact: Artifact | None
    said: str  # how it was told, for the report
    other_model: str | None = None  # the endpoint serves a file that is not OUT's


def _recorded_files(out: Path) -> dict[str, str]:
    """sha256 -> OUT-relative file, of the quantized files OUT's provenance.json records."""
    record = provenance.read(out) or {}
    rows = ((record.get("export") or {}).get("quantized") or {}).get("types") or []
    return {sha: name for row in rows for name, sha in (row.get("sha256") or {}).items()}


def _by_path(out: Path, found: list[Artifact], path: Path) -> Identity | None:
    for artifact in found:
        if path.resolve() == artifact.path.resolve():
            return Identity(artifact, f"{path}: OUT's {artifact.name}")
    if path.is_file() and path.suffix == ".gguf":
        recorded = _recorded_files(out)
        sha = provenance.file_sha256(path)
        if sha in recorded:
            same = next((a for a in found if str(a.path).endswith(recorded[sha])), None)
            return Identity(same, f"{path}: a copy of OUT's {recorded[sha]} (equal sha256)")
        return Identity(None, f"{path}: not one of OUT's files",
                        other_model=f"{path.name} (sha256 {sha[:12]}...), none of the files OUT's provenance.json "
                        "records: another model's file")  # fmt: skip
    return None


def identify(out: Path, entry: dict[str, Any]) -> Identity:
    """What the /v1/models `entry` is, of OUT's artifacts (module docstring)."""
    found = artifacts(out)
    name = str(entry["id"])
    for artifact in found:
        if name in (artifact.served_name(out), f"{artifact.served_name(out)}:latest"):
            return Identity(artifact, f"{name}: OUT's {artifact.name}, by the name serve gives it")
    for candidate in (entry.get("root"), name):
        if candidate and Path(str(candidate)).exists():
            known = _by_path(out, found, Path(str(candidate)))
            if known is not None:
                return known
    return Identity(None, f"{name}: which of OUT's artifacts it is cannot be told from its name")


def measured_share(out: Path, identity: Identity, report: dict[str, Any] | None) -> tuple[float, str]:
    """The share of prompts whose answer the export measured equal to the reference's for this artifact in its own
    runtime (1 for the export itself), or the lowest of OUT's where the artifact is not known."""
    rows = {r["type"]: r.get("answer_agreement") or {} for r in (report or {}).get("types", [])}
    shares = {name: float(row["agree"]) for name, row in rows.items() if row.get("measured")}
    artifact = identity.artifact
    if artifact is not None and artifact.name in (MODEL, ADAPTER):
        return 1.0, f"OUT's {artifact.name} is the reference itself"
    if artifact is not None and artifact.name in shares:
        return shares[artifact.name], f"export measured {shares[artifact.name]:.2f} for {artifact.name} in its runtime"
    if artifact is None and shares:
        lowest = min(shares, key=lambda k: shares[k])
        return shares[lowest], f"not identified: the lowest export measured, {lowest}'s {shares[lowest]:.2f}"
    return 1.0, "no measurement for it: the reference's own"
