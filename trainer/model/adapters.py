"""LoRA: a new adapter to train (apply_lora), a saved one attached to its base (attach_adapter: the one
PeftModel.from_pretrained), and an adapter folded into the base's weights (merged)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.config.sharding import fsdp_checkpoints_activations

if TYPE_CHECKING:
    from trainer.config.schema import TrainSettings

log = logging.getLogger("trainer")


def apply_lora(model: Any, s: TrainSettings, targets: list[str] | None = None, whole: list[str] | None = None) -> Any:
    """A new LoRA adapter on `model` as TRAIN_LORA_* say (QLoRA: the quantized base prepared for training first);
    `targets` replaces TRAIN_LORA_TARGETS' all-linear (a vision-language model's: its language model's linears),
    `whole` names modules trained whole beside the adapter (PEFT's modules_to_save: a projector)."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if s.quant != "none":
        checkpointing = s.grad_ckpt and not fsdp_checkpoints_activations(s)
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=checkpointing)
    elif s.grad_ckpt:
        # Frozen embeddings produce no grad; checkpointed blocks need an input that requires one.
        model.enable_input_require_grads()
    chosen: Any = s.lora_targets
    if chosen != "all-linear":
        chosen = [t.strip() for t in chosen.split(",") if t.strip()]
    elif targets is not None:
        chosen = targets
    lora = LoraConfig(r=s.lora_r, lora_alpha=s.lora_alpha, lora_dropout=s.lora_dropout, target_modules=chosen,
                      task_type="CAUSAL_LM", modules_to_save=whole or None)  # fmt: skip
    said = s.lora_targets if chosen is not targets else f"the {len(targets)} linears of the trained parts"
    log.info("LoRA: r=%d alpha=%d dropout=%g targets=%s%s", s.lora_r, s.lora_alpha, s.lora_dropout, said,
             f"; trained whole: {', '.join(whole)}" if whole else "")  # fmt: skip
    return get_peft_model(model, lora)  # its adapters are fp32 on a bf16/fp16 base (autocast_adapter_dtype)


def attach_adapter(base: Any, adapter: Path) -> Any:
    """base + a saved adapter through PEFT, unmerged (trainer.model.loading fits the base's embeddings to the
    tokenizer first, as the run did before adding its adapter)."""
    from peft import PeftModel

    return PeftModel.from_pretrained(base, str(adapter))


def merged(peft_model: Any) -> Any:
    """A copy of the PEFT model with the adapter folded into the weights (the original stays unmerged)."""
    import copy

    return copy.deepcopy(peft_model).merge_and_unload()
