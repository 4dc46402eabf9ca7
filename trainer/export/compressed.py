"""`export --quant fp8/w4a16`: compressed-tensors folders (the layout vLLM and SGLang load), made by llmcompressor's
oneshot at the version images/versions.toml pins (`[llmcompressor]`) and scored in Transformers' compressed-tensors
loader.

llmcompressor's pins differ from the training stack's (Transformers, huggingface-hub), so it runs in a child process
(trainer/export/compress_run.py) whose sys.path puts an overlay of just those packages ahead of this environment's
site-packages (scripts/setup_quant.py installs it; TRAINKIT_LLMCOMPRESSOR names another folder).

- fp8: llmcompressor's FP8_DYNAMIC: FP8 (E4M3) weights with a scale per output channel, activations quantized to FP8
  per token at run time. No calibration.
- w4a16: GPTQ, 4-bit integer weights in symmetric groups of GROUP_SIZE along the input, 16-bit activations,
  calibrated on up to CALIBRATION_WINDOWS windows (the gate's context) of the run's own training data, taken before
  the tail the gate may score on (trainer/export/quality.py's "head"), or of --calibration-data FILE.

Left unquantized, and named in the report: lm_head (as vLLM's compressed-tensors checkpoints keep it), and for w4a16
every linear layer whose input width is not a multiple of GROUP_SIZE (llmcompressor refuses those; the tiny preset's
688-wide down_proj). The gate loads each written folder back on the CPU, where neither the FP8 nor the Marlin kernels
exist: compressed-tensors dequantizes the weights into the export's dtype, and fp8's activations are quantized and
dequantized per token in it, so the scores are the format's arithmetic, not its GPU kernels'.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.errors import ConfigError
from trainer.export import answer_agreement, in_image, quality

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from trainer.config.run_record import RunRecord

log = logging.getLogger("trainer")

TYPES = ("fp8", "w4a16")
SCHEMES = {"fp8": "FP8_DYNAMIC", "w4a16": "W4A16"}
GROUP_SIZE = 128  # w4a16's group (llmcompressor's W4A16 preset)
BITS_PER_WEIGHT = {"fp8": 8.0, "w4a16": 4 + 16 / GROUP_SIZE}  # each weight, and w4a16's 16-bit scale per group
CALIBRATION_WINDOWS = 128
BATCH_TOKENS = 8192  # calibration tokens per forward pass (llmcompressor's cost is mostly per batch)
# The child's command after the interpreter, given JOB and RESULT (tests/trainer/broken_compressed.py runs its own
# wrapper of it instead, to damage a written folder).
CHILD: tuple[str, ...] = ("-m", "trainer.export.compress_run")
OVERLAY_ENV = "TRAINKIT_LLMCOMPRESSOR"
STAMP = "TRAINKIT_PINS.json"  # written by scripts/setup_quant.py
SETUP_HINT = ("install it with `python scripts/setup_quant.py` from a trainkit checkout, run by this environment's "
              "python (the pinned wheels into a cached overlay folder, once)")


@dataclass(frozen=True)
class Tools:
    overlay: Path
    pins: dict[str, str]  # distribution -> version, from the overlay's stamp

    @property
    def maker(self) -> str:
        return f"llmcompressor {self.pins.get('llmcompressor', '?')}"

    @property
    def runtime(self) -> str:
        return (f"transformers {self.pins.get('transformers', '?')} + compressed-tensors "
                f"{self.pins.get('compressed-tensors', '?')} (CPU, dequantized)")  # fmt: skip


@dataclass(frozen=True)
class Plan:
    types: list[str]
    tools: Tools
    calibration: quality.EvalText | None  # w4a16's


def default_folder() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "trainkit" / "llmcompressor" / "site"


def tools(types: list[str]) -> Tools:
    """The overlay, or ConfigError (exit 2) saying how to install it."""
    folder = Path(os.environ.get(OVERLAY_ENV) or default_folder())
    stamp = folder / STAMP
    where = f"{OVERLAY_ENV}={folder}" if os.environ.get(OVERLAY_ENV) else str(folder)
    if not stamp.is_file() or not (folder / "llmcompressor").is_dir():
        refusal = in_image.refusal("llmcompressor", types, "llmcompressor", "org.trainkit.compressed-export",
                                   SETUP_HINT)  # fmt: skip
        if refusal:
            raise ConfigError(refusal)
        raise ConfigError(f"export --quant {','.join(types)}: llmcompressor is not installed (no overlay in {where}); "
                          f"{SETUP_HINT}")  # fmt: skip
    wheels = json.loads(stamp.read_text()).get("wheels", {})
    return Tools(folder, dict(name.split("==", 1) for name in wheels))


def calibration_text(calibration_data: str | None, run: RunRecord | None, types: list[str]) -> quality.EvalText | None:
    """w4a16's calibration text (module docstring); None without w4a16; exit 2 when there is none."""
    if "w4a16" not in types:
        if calibration_data:
            raise ConfigError(f"export --calibration-data {calibration_data}: only --quant w4a16 calibrates; drop it")
        return None
    if calibration_data:
        path = Path(calibration_data)
        text = quality.read_text(path, f"--calibration-data {calibration_data}")
        return quality.EvalText(text, f"--calibration-data {path.name}", path)
    if run is None:
        raise ConfigError("export --quant w4a16: GPTQ needs calibration text and SRC is not a run's folder; give "
                          "--calibration-data FILE (.txt, .jsonl or .json: text like the model's own, not the text "
                          "the gate scores on)")  # fmt: skip
    return quality.run_text(run, "head", "--calibration-data")


def plan(types: list[str], run: RunRecord | None, calibration_data: str | None) -> Plan | None:
    wanted = [t for t in types if t in TYPES]
    calibration = calibration_text(calibration_data, run, wanted)
    if not wanted:
        return None
    return Plan(wanted, tools(wanted), calibration)


def _weights_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


Made = tuple[dict[str, Any], quality.Scores, list[list[int]]]  # a type's report row, scores and answers


def produce(plan: Plan, staging: Path, tokenizer: PreTrainedTokenizerBase, chunks: list[list[int]],
            asking: answer_agreement.Job, work: Path) -> list[Made]:  # fmt: skip
    """Each type's folder in staging/TYPE/, made and scored in the child process, and its answers to `asking`'s
    prompts (trainer/export/answer_agreement.py); (row, scores, answers) per type."""
    context = len(chunks[0])
    calibration: list[list[int]] = []
    if plan.calibration is not None:
        calibration, _ = quality.text_windows(tokenizer, plan.calibration, context, CALIBRATION_WINDOWS,
                                              "calibration text", "--calibration-data")  # fmt: skip
    batch = max(1, min(len(calibration), BATCH_TOKENS // context))
    jobs = [{"type": kind, "scheme": SCHEMES[kind], "out": str(staging / kind),
             "calibration": calibration if kind == "w4a16" else [], "batch": batch,
             "group_size": GROUP_SIZE if kind == "w4a16" else 0} for kind in plan.types]  # fmt: skip
    job, result = work / "job.json", work / "result.json"
    job.write_text(json.dumps({"overlay": str(plan.tools.overlay), "model": str(staging), "windows": chunks,
                               "answers": asking.to_json(), "types": jobs}))  # fmt: skip
    log.info("export: llmcompressor (%s) makes %s in a child process", plan.tools.maker, ", ".join(plan.types))
    start = time.monotonic()
    done = subprocess.run([sys.executable, *CHILD, str(job), str(result)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0 or not result.is_file():
        raise RuntimeError(f"llmcompressor's child process failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    found = json.loads(result.read_text())
    log.info("export: %s made and scored in %.0f s", ", ".join(plan.types), time.monotonic() - start)
    rows = []
    for kind in plan.types:
        made = found["types"][kind]
        folder = staging / kind
        row: dict[str, Any] = {"type": kind, "file": f"{kind}/", "bytes": _weights_bytes(folder),
                               "runtime": plan.tools.runtime, "made_by": f"{plan.tools.maker} ({made['recipe']})",
                               "unquantized_layers": made["unquantized"], "seconds": made["seconds"]}  # fmt: skip
        if kind == "w4a16" and plan.calibration is not None:
            row["calibration"] = {"origin": plan.calibration.origin, "path": quality.paths(plan.calibration),
                                  "sha256": plan.calibration.sha256, "windows": len(calibration),
                                  "context": context}  # fmt: skip
        rows.append((row, quality.Scores(made["nll"], made["top"]), made["answers"]))
    return rows
