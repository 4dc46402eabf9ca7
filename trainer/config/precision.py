"""The precision group's home (TRAIN_PRECISION, TRAIN_TF32): their checks, decisions and TrainingArguments, the dtype
each precision computes in, and what it sets elsewhere (DeepSpeed's blocks, flash attention's need for half precision,
fp16's loss scaling).

Every function here takes the decision's value (fp32, bf16, fp16, fp8) and asks `autocast` first, so the rule that
fp8 runs as bf16 is written once. Dtypes are named, not torch objects: torch-free callers (export's and generate's
command lines) import this without torch; `compute_dtype` maps a name to torch's dtype on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainer import compat
from trainer.config.decision import Decision, Decisions, SoFar
from trainer.errors import ConfigError
from trainer.methods import of

if TYPE_CHECKING:
    import torch

    from trainer.config.inputs import Inputs
    from trainer.config.schema import TrainSettings
    from trainer.machine.hardware import Hardware

DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}  # precision -> torch's dtype name
# fp8 runs bf16 mixed precision (autocast, fp32 master weights) with float8 matmuls in the decoder's linear layers
# (trainer.model.float8): everything else, the attention, the LM head and the loss included, computes as bf16 does.
AUTOCAST = {"fp8": "bf16"}
# FP8 tensor cores: Ada (8.9), Hopper (9.0) and Blackwell; torch._scaled_mm, which torchao's float8 matmuls call,
# runs there only.
FP8_CAPABILITY = (8, 9)


def autocast(precision: str) -> str:
    """The mixed precision a precision decision runs under (fp8: bf16's autocast; the others: themselves)."""
    return AUTOCAST.get(precision, precision)


def compute_dtype_name(precision: str) -> str:
    """The dtype name a precision decision computes in (bf16, fp16; anything else, e.g. nothing recorded: fp32)."""
    return DTYPE_NAMES.get(autocast(precision), "float32")


def compute_dtype_bytes(precision: str) -> int:
    """Bytes per value of the dtype a precision decision computes in."""
    return 4 if compute_dtype_name(precision) == "float32" else 2


def compute_dtype(precision: str) -> torch.dtype:
    """The torch dtype a precision decision computes in."""
    import torch

    return getattr(torch, compute_dtype_name(precision))


def float8_matmuls(precision: str) -> bool:
    """Whether the decoder's linear layers multiply in float8 (trainer.model.float8 converts them)."""
    return precision == "fp8"


def computes_in_half(precision: str) -> bool:
    """Whether the model computes in fp16 or bf16 (what flash attention needs)."""
    return compute_dtype_name(precision) != "float32"


def scales_loss(precision: str) -> bool:
    """fp16's loss scaling: its scaler skips a step with non-finite gradients by itself."""
    return autocast(precision) == "fp16"


def mixed_precision_flags(precision: str) -> dict[str, bool]:
    """TrainingArguments' mixed-precision flags."""
    mixed = autocast(precision)
    return {"bf16": mixed == "bf16", "fp16": mixed == "fp16"}


def deepspeed_blocks(precision: str) -> dict[str, Any]:
    """The generated DeepSpeed config's precision block; "auto" lets the Trainer enable it exactly when its own
    bf16/fp16 flag is on."""
    mixed = autocast(precision)
    if mixed == "bf16":
        return {"bf16": {"enabled": "auto"}}
    if mixed == "fp16":
        return {
            "fp16": {
                "enabled": "auto",
                "loss_scale": 0,
                "loss_scale_window": 1000,
                "initial_scale_power": 16,
                "hysteresis": 2,
                "min_loss_scale": 1,
            }
        }
    return {}


def _fp8_problem(s: TrainSettings, hw: Hardware) -> str | None:
    """Why TRAIN_PRECISION=fp8 cannot run here, or None. Float8 training was built for one process training the
    whole model; the combinations below were neither built nor measured, so they are refused, not guessed at."""
    instead = "set TRAIN_PRECISION=bf16 (or auto)"
    if not hw.is_gpu or hw.capability is None:
        return (f"TRAIN_PRECISION=fp8 needs a GPU with FP8 tensor cores (compute capability 8.9+: Ada, Hopper, "
                f"Blackwell); this is {hw.describe()}; {instead}")  # fmt: skip
    if hw.capability < FP8_CAPABILITY:
        fallback = instead if hw.bf16 else "set TRAIN_PRECISION=fp16 (or auto)"
        return (f"TRAIN_PRECISION=fp8 needs FP8 tensor cores (compute capability 8.9+: Ada, Hopper, Blackwell); "
                f"{hw.describe()} has none; {fallback}")  # fmt: skip
    if not hw.libraries.get("torchao", False):
        return ("TRAIN_PRECISION=fp8 needs torchao (its float8 training), which is not installed; the images from "
                f"the CUDA 12.6 row on ship it (outside them: pip install -e '.[train]'), or {instead}")  # fmt: skip
    other = [name for name, on in (("DeepSpeed", s.zero_stage > 0 or bool(s.deepspeed_config)),
                                   (f"TRAIN_FSDP={s.fsdp}", s.fsdp != "none"), ("TRAIN_LORA=1", s.lora),
                                   (f"TRAIN_QUANT={s.quant}", s.quant != "none"),
                                   (f"TRAIN_METHOD={s.method}", of(s.method).family != "sft")) if on]  # fmt: skip
    if other:
        return f"TRAIN_PRECISION=fp8 is built for SFT of the whole model, not with {other[0]}; {instead}"
    return None


def _fp8_reason(hw: Hardware) -> str:
    return (f"set by TRAIN_PRECISION: torchao float8 training on {hw.gpu_name}'s FP8 tensor cores: the decoder's "
            "linear layers (not the LM head; only those whose dimensions are multiples of 16) multiply in float8 "
            "with tensorwise dynamic scaling, inside bf16 autocast, on fp32 master weights and optimizer state; "
            "fastest with torch.compile, which fuses the scaling; mfu in metrics.jsonl is bf16-equivalent (the "
            "model's FLOPs over the GPU's dense bf16 peak)")  # fmt: skip


def decide_precision(s: TrainSettings, hw: Hardware) -> Decision[str]:
    """TRAIN_PRECISION on this machine, or a ConfigError saying why it cannot run here."""
    if s.precision == "fp8":
        problem = _fp8_problem(s, hw)
        if problem:
            raise ConfigError(problem)
        return Decision("fp8", _fp8_reason(hw))
    if s.precision == "auto":
        if not hw.is_gpu:
            return Decision("fp32", "auto: no CUDA GPU; mixed precision would not speed up CPU training")
        if hw.bf16:
            return Decision("bf16", f"auto: {hw.gpu_name} supports bf16 (same range as fp32, no loss scaling)")
        return Decision("fp16", f"auto: {hw.gpu_name} has no bf16; fp16 with loss scaling")
    if s.precision == "fp16" and not hw.is_gpu:
        raise ConfigError("TRAIN_PRECISION=fp16 needs a CUDA GPU (no fp16 mixed precision on CPU); use fp32 or bf16")
    if s.precision == "bf16" and hw.is_gpu and not hw.bf16:
        raise ConfigError(
            f"TRAIN_PRECISION=bf16: {hw.describe()} has no bf16 support (needs compute capability 8.0+); use fp16"
        )
    where = "CPU autocast" if not hw.is_gpu else hw.gpu_name
    return Decision(s.precision, f"set by TRAIN_PRECISION ({where})")


def decide_tf32(s: TrainSettings, hw: Hardware) -> Decision[bool]:
    if s.tf32 == "1" and not hw.tf32:
        raise ConfigError(
            f"TRAIN_TF32=1 needs an Ampere or newer GPU (compute capability 8.0+); this is {hw.describe()}"
        )
    if s.tf32 in ("0", "1"):
        return Decision(s.tf32 == "1", "set by TRAIN_TF32")
    if hw.tf32:
        return Decision(True, "auto: Ampere or newer GPU; TF32 matmuls are ~8x faster than fp32 at negligible cost")
    return Decision(False, "auto: " + ("no CUDA GPU" if not hw.is_gpu else "GPU older than Ampere has no TF32"))


# ---- the group's three functions (trainer/config/checks.py, decisions.py, training_arguments.py call them) ----------


def problems(inputs: Inputs) -> list[str]:
    """TRAIN_PRECISION that this stack's row cannot run (the machine's refusals come with the decision)."""
    refusal = compat.switch_problem(f"TRAIN_PRECISION={inputs.settings.precision}")
    return [refusal] if refusal else []


def decide(inputs: Inputs, hardware: Hardware, so_far: SoFar) -> dict[str, Decision]:
    s = inputs.settings
    return {
        "precision": so_far.attempt(decide_precision, s, hardware, fallback=Decision("fp32", "refused")),
        "tf32": so_far.attempt(decide_tf32, s, hardware, fallback=Decision(False, "refused")),
    }


def arguments(settings: TrainSettings, decisions: Decisions, hardware: Hardware) -> dict[str, Any]:
    """The mixed-precision flags, and tf32 on a GPU (None on CPU: Transformers' own default)."""
    return {**mixed_precision_flags(decisions.precision.value),
            "tf32": decisions.tf32.value if hardware.is_gpu else None}  # fmt: skip
