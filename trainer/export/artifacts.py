"""What an export folder holds that a server can serve, torch-free: read by `serve` (which to start, with what) and
`check` (which of them an endpoint serves).

- the export itself (config.json and safetensors weights): vLLM;
- each GGUF file (OUT/gguf/, `export --quant q8_0`), with the Ollama Modelfile export wrote beside it: llama.cpp;
- each compressed-tensors folder (OUT/fp8/, OUT/w4a16/, `export --quant fp8`): vLLM;
- an adapter (`export --adapter-only`): vLLM, on the base its adapter_config.json names (or --base).

Each is named as `serve` names the model it serves: OUT's folder name for the export and the adapter, NAME:TYPE for a
quantized file (Ollama's name:tag), so that `check` knows which one an endpoint serves.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.errors import ConfigError

LLAMA_CPP, VLLM = "llama.cpp", "vllm"
MODEL, ADAPTER = "model", "adapter"  # the names of the export itself and of an adapter export


@dataclass(frozen=True)
class Artifact:
    name: str  # "model", "adapter", or a quantized type (q8_0, fp8)
    path: Path  # the file or folder a server loads
    runtime: str  # LLAMA_CPP or VLLM
    shown: str  # where it is, relative to OUT, for messages
    modelfile: Path | None = None  # a GGUF file's Ollama Modelfile
    base: str | None = None  # an adapter's base model, as its adapter_config.json names it

    def served_name(self, out: Path) -> str:
        return out.name if self.name in (MODEL, ADAPTER) else f"{out.name}:{self.name}"

    def describe(self) -> str:
        return f"{self.name} ({self.shown}, {self.runtime})"


def read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{what}: cannot read {path}: {exc}") from None
    if not isinstance(found, dict):
        raise ConfigError(f"{what}: {path} does not hold a JSON object")
    return found


def _full_model(out: Path) -> bool:
    return (out / "config.json").is_file() and any(out.glob("*.safetensors"))


def _gguf(out: Path) -> list[Artifact]:
    found = []
    for path in sorted(out.glob("gguf/*.gguf")) + sorted(out.glob("*.gguf")):
        kind = path.name.removesuffix(".gguf").rsplit(".", 1)[-1]
        modelfile = path.with_name(path.name.removesuffix(".gguf") + ".Modelfile")
        found.append(Artifact(kind, path, LLAMA_CPP, str(path.relative_to(out)),
                              modelfile if modelfile.is_file() else None))  # fmt: skip
    return found


def _compressed(out: Path) -> list[Artifact]:
    found = []
    for config in sorted(out.glob("*/config.json")):
        method = (json.loads(config.read_text()).get("quantization_config") or {}).get("quant_method")
        if method == "compressed-tensors" and any(config.parent.glob("*.safetensors")):
            found.append(Artifact(config.parent.name, config.parent, VLLM, config.parent.name + "/"))
    return found


def artifacts(out: Path) -> list[Artifact]:
    """Everything in OUT a server can load, the export itself first."""
    if (out / "adapter_config.json").is_file():
        base = read_json(out / "adapter_config.json", f"{out}").get("base_model_name_or_path")
        return [Artifact(ADAPTER, out, VLLM, "adapter_config.json", base=str(base) if base else None)]
    found = [Artifact(MODEL, out, VLLM, "./")] if _full_model(out) else []
    return found + _gguf(out) + _compressed(out)


def export_folder(out: Path, what: str) -> Path:
    """OUT as a folder that exists, or ConfigError (exit 2) naming it."""
    if not out.is_dir():
        raise ConfigError(f"{what} {out}: no such folder; give an export folder (python -m trainer export RUN OUT)")
    return out.resolve()


def named(found: list[Artifact], name: str, out: Path, what: str) -> Artifact:
    """The artifact called `name`, or ConfigError naming those OUT holds."""
    for artifact in found:
        if artifact.name == name:
            return artifact
    listed = ", ".join(a.describe() for a in found) or "nothing servable"
    raise ConfigError(f"{what} {out} --artifact {name}: no such artifact; OUT holds {listed}")


def nothing_servable(out: Path) -> str:
    return (f"{out} holds nothing a server can load: no model folder (config.json and safetensors weights), no GGUF "
            "file, no compressed-tensors folder, no adapter; export a run first (python -m trainer export RUN OUT, "
            "--quant q8_0 for llama.cpp and Ollama)")  # fmt: skip
