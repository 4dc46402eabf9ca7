"""The written folder must load with plain Transformers (no adapter, no peft) and compute what the reference does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PROBE_TEXT = "The quick brown fox jumps over the lazy dog. 0123456789"
# Largest |exported - reference| allowed, relative to the largest |reference logit| (plus 1): each dtype's rounding.
TOLERANCE = {"float32": 1e-4, "bfloat16": 4e-2, "float16": 8e-3}


class ExportMismatch(Exception):
    """The exported folder does not load or does not compute what its source does: exit 1."""


def probe_ids(tokenizer: Any, vocab_size: int) -> Any:
    """The probe's inputs: {input_ids} of the probe text; a vision-language model's processor gives a probe with
    an image (trainer.export.vision.probe_inputs)."""
    import torch

    if hasattr(tokenizer, "image_processor"):
        from trainer.export.vision import probe_inputs

        return probe_inputs(tokenizer)
    ids = tokenizer(PROBE_TEXT, return_tensors="pt")["input_ids"] if tokenizer is not None else None
    if ids is None or ids.numel() == 0 or int(ids.max()) >= vocab_size:
        ids = torch.arange(min(32, vocab_size)).unsqueeze(0)
    return {"input_ids": ids}


def logits(model: Any, inputs: dict[str, Any]) -> Any:
    import torch

    model.eval()
    with torch.no_grad():
        return model(**{k: v.to(model.device) for k, v in inputs.items()}).logits.float().cpu()


def verify(folder: Path, reference_logits: Any, inputs: dict[str, Any], dtype_name: str) -> float:
    """Load `folder` as a plain model (a vision-language one as AutoModelForImageTextToText, with its processor)
    and compare its logits; returns the relative difference, or raises."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainer.model.vision import model_class

    if (folder / "adapter_config.json").exists():
        raise ExportMismatch(f"{folder} holds adapter_config.json: it would load through peft, not as a plain model")
    cls = AutoModelForCausalLM
    try:
        cls = model_class(AutoConfig.from_pretrained(str(folder))) or cls
        model = cls.from_pretrained(str(folder))
    except Exception as exc:  # any refusal means the folder is not usable
        raise ExportMismatch(f"{folder} does not load with {cls.__name__}.from_pretrained: {exc}") from None
    if "pixel_values" in inputs:
        from trainer.export.vision import processor_problem

        problem = processor_problem(folder, inputs)
        if problem:
            raise ExportMismatch(problem)
    lora = [name for name, _ in model.named_parameters() if "lora_" in name]
    if lora:
        raise ExportMismatch(f"{folder} still holds LoRA weights ({lora[0]}, ...): the adapter was not merged")
    got = logits(model, inputs)
    if got.shape != reference_logits.shape:
        raise ExportMismatch(f"logits shape {tuple(got.shape)} differs from the reference's "
                             f"{tuple(reference_logits.shape)}")  # fmt: skip
    scale = float(reference_logits.abs().max()) + 1.0
    diff = float((got - reference_logits).abs().max()) / scale
    if not diff <= TOLERANCE[dtype_name]:
        raise ExportMismatch(f"logits differ from the reference by {diff:.3g} (relative to the largest logit), above "
                             f"the {dtype_name} tolerance {TOLERANCE[dtype_name]:g}")  # fmt: skip
    return diff
