"""The adapters group's home (TRAIN_LORA*, TRAIN_QUANT, TRAIN_NEFTUNE_ALPHA, TRAIN_TRAINABLE): LoRA and QLoRA's
checks, decisions and TrainingArguments, and which parts of a vision-language model train. The adapters themselves are
made by trainer/model/adapters.py, the quantization by trainer/model/quantization.py, the freeze by
trainer/model/vision_parts.py."""

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


PARTS = ("vision", "projector", "language")  # trainer.model.vision_parts' parts, in the order they are shown


def trainable_parts(value: str) -> list[str]:
    """TRAIN_TRAINABLE's parts, each once, in PARTS' order (unknown words left to `_trainable_problems`)."""
    named = {word.strip() for word in value.split(",") if word.strip()}
    return [part for part in PARTS if part in named]


def _trainable_problems(inputs: Inputs) -> list[str]:
    """TRAIN_TRAINABLE: known parts, at least one, applying to records with images; with LoRA, a part LoRA adapts."""
    from trainer.data.vision import has_images

    s = inputs.settings
    words = [word.strip() for word in s.trainable.split(",") if word.strip()]
    unknown = [word for word in words if word not in PARTS]
    if unknown or not words:
        return [f"TRAIN_TRAINABLE={s.trainable!r}: {'unknown part ' + ', '.join(unknown) if unknown else 'no part'}; "
                f"name the parts of a vision-language model to train, comma-separated: {', '.join(PARTS)}"]  # fmt: skip
    if "trainable" in s.model_fields_set and not has_images(inputs.data.layouts):
        return [f"TRAIN_TRAINABLE={s.trainable}: it chooses what trains of a vision-language model on records with "
                "images, and TRAIN_DATA holds none; leave it unset"]  # fmt: skip
    if s.lora and not {"vision", "language"} & set(words):
        return [f"TRAIN_TRAINABLE={s.trainable} with TRAIN_LORA=1: LoRA adapts the linears of the vision tower or the "
                "language model and trains the projector whole; name vision or language too, or train without "
                "TRAIN_LORA"]  # fmt: skip
    return []


def problems(inputs: Inputs) -> list[str]:
    s = inputs.settings
    return [*_quant_problems(s), *_library_problems(s), *_trainable_problems(inputs)]


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
        "trainable": _decide_trainable(inputs),
    }


def _decide_trainable(inputs: Inputs) -> Decision[list[str]]:
    from trainer.data.vision import has_images

    s = inputs.settings
    if not has_images(inputs.data.layouts):
        return Decision(["language"], "no records with images: the model trains as a whole (TRAIN_TRAINABLE is for "
                                      "vision-language models)")  # fmt: skip
    parts = trainable_parts(s.trainable)
    frozen = [part for part in PARTS if part not in parts]
    how = "; with LoRA on their linears (the projector whole)" if s.lora else ""
    return Decision(parts, f"TRAIN_TRAINABLE={s.trainable}: {', '.join(parts)} train"
                           f"{'; ' + ', '.join(frozen) + ' frozen (checked)' if frozen else ''}{how}")


def arguments(settings: TrainSettings, decisions: Decisions, hardware: Hardware) -> dict[str, Any]:
    return {"neftune_noise_alpha": settings.neftune_alpha or None}
