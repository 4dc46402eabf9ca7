"""The adapters group's home (TRAIN_LORA*, TRAIN_QUANT, TRAIN_NEFTUNE_ALPHA): LoRA and QLoRA's checks, decisions and
TrainingArguments. The adapters themselves are made by trainer/model/adapters.py, the quantization by
trainer/model/quantization.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainer import compat
from trainer.config.decision import Decision, Decisions, SoFar
from trainer.errors import ConfigError
from trainer.machine.hardware import missing_package_problem

if TYPE_CHECKING:
    from trainer.config.inputs import Inputs
    from trainer.config.schema import TrainSettings
    from trainer.machine.hardware import Hardware


def _quant_problems(s: TrainSettings) -> list[str]:
    """TRAIN_QUANT against LoRA and the sharders."""
    if s.quant == "none":
        return []
    problems = []
    if s.zero_stage == 3:
        problems.append(
            f"TRAIN_QUANT={s.quant} with TRAIN_ZERO_STAGE=3: ZeRO-3 would partition weights bitsandbytes has already "
            "packed (and Transformers refuses its device placement); use TRAIN_ZERO_STAGE=2, or TRAIN_FSDP=full_shard "
            "with TRAIN_QUANT=4bit"
        )
    if s.quant == "8bit" and s.fsdp != "none":
        problems.append(
            f"TRAIN_QUANT=8bit with TRAIN_FSDP={s.fsdp}: FSDP cannot shard bitsandbytes' 8-bit weights; "
            "use TRAIN_QUANT=4bit with FSDP, or TRAIN_FSDP=none"
        )
    if s.quant == "4bit" and s.fsdp in ("hybrid_shard", "no_shard"):
        problems.append(
            f"TRAIN_QUANT=4bit with TRAIN_FSDP={s.fsdp} (FSDP1): QLoRA shards with FSDP2 only; "
            "use TRAIN_FSDP=full_shard or shard_grad_op"
        )
    if not s.lora:
        problems.append(
            f"TRAIN_QUANT={s.quant} needs TRAIN_LORA=1: quantized weights are frozen, only LoRA adapters train (QLoRA)"
        )
    return problems


def _library_problems(s: TrainSettings) -> list[str]:
    needs = [("peft", "TRAIN_LORA=1", "pip install peft")] if s.lora else []
    if s.quant != "none":
        needs.append(("bitsandbytes", f"TRAIN_QUANT={s.quant}", "pip install bitsandbytes"))
    return [problem for problem in (missing_package_problem(*need) for need in needs) if problem]


def problems(inputs: Inputs) -> list[str]:
    s = inputs.settings
    return [*_quant_problems(s), *_library_problems(s)]


def decide_quant(s: TrainSettings, hw: Hardware) -> Decision[str]:
    if s.quant == "none":
        return Decision("none", "TRAIN_QUANT=none")
    if not hw.is_gpu:
        version = compat.installed_version("bitsandbytes")
        if not compat.bitsandbytes_quantizes_on_cpu():
            raise ConfigError(
                f"TRAIN_QUANT={s.quant} on CPU needs bitsandbytes 0.46+ (CPU backend); {version} is installed"
            )
        return Decision(s.quant, f"set by TRAIN_QUANT; bitsandbytes {version} quantizes on CPU too (slowly)")
    return Decision(s.quant, "set by TRAIN_QUANT (QLoRA: frozen quantized base, LoRA adapters train)")


def decide(inputs: Inputs, hardware: Hardware, so_far: SoFar) -> dict[str, Decision]:
    s = inputs.settings
    lora = f"r={s.lora_r} alpha={s.lora_alpha} targets={s.lora_targets}" if s.lora else "TRAIN_LORA=0"
    return {
        "quant": so_far.attempt(decide_quant, s, hardware, fallback=Decision("none", "refused")),
        "lora": Decision(s.lora, lora),
    }


def arguments(settings: TrainSettings, decisions: Decisions, hardware: Hardware) -> dict[str, Any]:
    return {"neftune_noise_alpha": settings.neftune_alpha or None}
