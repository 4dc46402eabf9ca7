"""The optim group's home (TRAIN_OPTIM, TRAIN_LR, TRAIN_BATCH_SIZE, TRAIN_GRAD_ACCUM, TRAIN_AUTO_BATCH,
TRAIN_NUM_WORKERS, TRAIN_PIN_MEMORY): the optimizer, the micro-batch and its accumulation, the DataLoader; their
checks, decisions and TrainingArguments. The batch search itself is trainer/run/batch_search.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainer import compat, transformers_names
from trainer.config.decision import Decision, Decisions, SoFar
from trainer.config.sharding import deepspeed_replaces_optimizer, uses_deepspeed, uses_fsdp
from trainer.config.speed import not_measured_with
from trainer.errors import ConfigError
from trainer.machine.hardware import module_available
from trainer.methods import of

if TYPE_CHECKING:
    from trainer.config.inputs import Inputs
    from trainer.config.schema import TrainSettings
    from trainer.machine.hardware import Hardware


# ---- checks ---------------------------------------------------------------------------------------------------------


def _optimizer_problems(s: TrainSettings) -> list[str]:
    if s.optim == "auto":
        return []
    names = transformers_names.all_optimizer_names()
    if s.optim not in names:
        return [
            f"TRAIN_OPTIM={s.optim!r} is not an optimizer Transformers knows"
            f"{transformers_names.did_you_mean(s.optim, names)}; "
            "e.g. adamw_torch, adamw_torch_fused, adamw_apex_fused, adamw_bnb_8bit, adafactor"
        ]
    library = transformers_names.optimizer_library(s.optim)
    if library is None:
        return []
    module, hint = library
    available = module_available(module) and (s.optim != transformers_names.APEX_FUSED or module_available("amp_C"))
    if available:
        return []
    return [f"TRAIN_OPTIM={s.optim} needs {module!r}, which is not installed ({hint}); or use TRAIN_OPTIM=auto"]


def _combination_problems(s: TrainSettings) -> list[str]:
    problems = []
    if uses_fsdp(s) and (s.optim in transformers_names.BNB_OPTIMIZERS or s.optim == transformers_names.APEX_FUSED):
        problems.append(
            f"TRAIN_OPTIM={s.optim} with TRAIN_FSDP={s.fsdp}: its fused kernels take plain tensors, not FSDP's sharded "
            "DTensor parameters (bitsandbytes #1633, #89); use TRAIN_OPTIM=adamw_torch_fused (or auto) with FSDP"
        )
    if s.auto_batch == "1" and uses_deepspeed(s):
        problems.append(
            "TRAIN_AUTO_BATCH=1 does not work with DeepSpeed (its batch size is fixed at initialization); "
            "set TRAIN_BATCH_SIZE yourself or TRAIN_ZERO_STAGE=0"
        )
    if s.auto_batch == "1" and uses_fsdp(s):
        problems.append(
            f"TRAIN_AUTO_BATCH=1 does not work with TRAIN_FSDP={s.fsdp} (the search probes the whole model on each "
            "GPU, before FSDP shards it); set TRAIN_BATCH_SIZE yourself or TRAIN_FSDP=none"
        )
    if of(s.method).needs_trl and (s.optim == transformers_names.APEX_FUSED or s.auto_batch == "1"):
        what = "TRAIN_OPTIM=adamw_apex_fused" if s.optim == transformers_names.APEX_FUSED else "TRAIN_AUTO_BATCH=1"
        problems.append(f"{what} is not supported with TRAIN_METHOD={s.method} yet (trainkit applies it to SFT's "
                        "trainer only); use TRAIN_OPTIM=auto and set TRAIN_BATCH_SIZE")  # fmt: skip
    return problems


def problems(inputs: Inputs) -> list[str]:
    s = inputs.settings
    refusal = compat.switch_problem(f"TRAIN_OPTIM={s.optim}")
    return [*_combination_problems(s), *([refusal] if refusal else []), *_optimizer_problems(s)]


# ---- decisions ------------------------------------------------------------------------------------------------------


def decide_optim(s: TrainSettings, hw: Hardware) -> Decision[str]:
    if deepspeed_replaces_optimizer(s):
        return Decision("deepspeed", "ZeRO offload: DeepSpeed's AdamW (CPU Adam) replaces TRAIN_OPTIM")
    if s.optim == "auto":
        if hw.is_gpu:
            return Decision("adamw_torch_fused", "auto: fused CUDA AdamW (one kernel for all parameters)")
        if compat.stack().fused_adamw_on_cpu:
            return Decision("adamw_torch_fused", "auto: torch's fused CPU AdamW (Transformers' own default)")
        return Decision("adamw_torch", "auto: no CUDA GPU, and this torch has no fused CPU AdamW")
    cpu_problem = None if hw.is_gpu else compat.cpu_optimizer_problem(s.optim)
    if cpu_problem:
        raise ConfigError(cpu_problem)
    if s.optim == transformers_names.APEX_FUSED and not hw.is_gpu:
        raise ConfigError(
            "TRAIN_OPTIM=adamw_apex_fused needs a CUDA GPU (apex FusedAdam is CUDA only); use adamw_torch"
        )
    return Decision(s.optim, "set by TRAIN_OPTIM")


def decide_pin_memory(s: TrainSettings, hw: Hardware) -> Decision[bool]:
    if s.pin_memory != "auto":
        note = "" if hw.is_gpu or s.pin_memory == "0" else " (no effect without a GPU)"
        return Decision(s.pin_memory == "1", "set by TRAIN_PIN_MEMORY" + note)
    if hw.is_gpu:
        return Decision(True, "auto: page-locked host memory makes host-to-GPU copies faster and asynchronous")
    return Decision(False, "auto: no GPU to copy to")


def _auto_batch(s: TrainSettings, hw: Hardware) -> Decision[bool]:
    if s.auto_batch != "auto":
        return Decision(s.auto_batch == "1", f"set by TRAIN_AUTO_BATCH={s.auto_batch}")
    if not hw.is_gpu:
        return Decision(False, "auto: off (no GPU: a CPU has no out-of-memory error to search against)")
    other = not_measured_with(s)
    if other:
        return Decision(False, f"auto: off ({other}: the search probes the whole model on one GPU)")
    return Decision(True, "auto: on (a GPU): the largest micro-batch that fits is searched before training")


def decide_auto_batch(s: TrainSettings, hw: Hardware) -> Decision[bool]:
    chosen = _auto_batch(s, hw)
    if chosen.value and of(s.method).needs_trl:  # TRAIN_AUTO_BATCH=1 is refused (_combination_problems)
        return Decision(False, f"TRAIN_METHOD={s.method}: the batch search probes SFT's packed batches; "
                        "TRAIN_BATCH_SIZE is used as set")  # fmt: skip
    return chosen


def effective_batch_set(s: TrainSettings) -> bool:
    """True when the user set TRAIN_BATCH_SIZE or TRAIN_GRAD_ACCUM: their product is the batch the search keeps."""
    return bool({"batch_size", "grad_accum"} & s.model_fields_set)


def decide_grad_accum(s: TrainSettings) -> Decision[int]:
    set_by = "set by TRAIN_GRAD_ACCUM" if "grad_accum" in s.model_fields_set else "default TRAIN_GRAD_ACCUM"
    return Decision(s.grad_accum, set_by)


def decide_batch_size(s: TrainSettings, auto_batch: bool) -> Decision[int]:
    if not auto_batch:
        return Decision(s.batch_size, "set by TRAIN_BATCH_SIZE")
    if effective_batch_set(s):
        keeps = (f"keeping the effective batch TRAIN_BATCH_SIZE x TRAIN_GRAD_ACCUM = {s.batch_size * s.grad_accum} "
                 "per device through gradient accumulation")  # fmt: skip
    else:
        keeps = "with no accumulation (TRAIN_BATCH_SIZE and TRAIN_GRAD_ACCUM not set: the effective batch changes)"
    return Decision(s.batch_size, f"TRAIN_AUTO_BATCH: searched on the GPU when training starts, {keeps}; "
                                  "run_config.json in the output folder records the batch chosen")  # fmt: skip


def decide(inputs: Inputs, hardware: Hardware, so_far: SoFar) -> dict[str, Decision]:
    s = inputs.settings
    auto_batch = decide_auto_batch(s, hardware)
    return {
        "optim": so_far.attempt(decide_optim, s, hardware, fallback=Decision("adamw_torch", "refused")),
        "pin_memory": decide_pin_memory(s, hardware),
        "auto_batch": auto_batch,
        "batch_size": decide_batch_size(s, auto_batch.value),
        "grad_accum": decide_grad_accum(s),
    }


# ---- TrainingArguments ----------------------------------------------------------------------------------------------


def arguments(settings: TrainSettings, decisions: Decisions, hardware: Hardware) -> dict[str, Any]:
    s, optim = settings, decisions.optim.value
    return {
        "per_device_train_batch_size": s.batch_size,
        "gradient_accumulation_steps": decisions.grad_accum.value,
        "auto_find_batch_size": False,  # TRAIN_AUTO_BATCH searches before training (trainer.run.batch_search)
        "learning_rate": s.lr,
        "optim": "adamw_torch" if optim in ("deepspeed", transformers_names.APEX_FUSED) else optim,
        "dataloader_num_workers": s.num_workers,
        "dataloader_pin_memory": decisions.pin_memory.value,
    } | _persistent_workers(s)


def _persistent_workers(s: TrainSettings) -> dict[str, bool]:
    """Workers kept across epochs where there are any; online RL's TRL config makes them anew each epoch
    (trainer/config/online.py says why)."""
    return {} if of(s.method).family == "online" else {"dataloader_persistent_workers": s.num_workers > 0}
