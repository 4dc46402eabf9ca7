"""The catalogue of `bench` rows: each row is the baseline plus a few TRAIN_* overrides.

Kept free of torch so `python -m trainer bench --list` and host tools can read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

BASELINE = "fp32"
UNSET = "(unset)"  # a row's value that removes the variable from the trainer's environment (the trainer's default)
DEFAULTS = "auto"
COMBINED = "combined"
MAX_BATCH = "max_batch"
GRAD_ACCUM = "grad_accum"
ADAPTER_ROWS = ("lora", "qlora")
PRECOMPUTED_REFERENCE = "pref_precompute"
RL_SPLIT = "rl_split"

# Every technique variable the bench controls, at its baseline value. Each row changes a few of
# these, so a row differs from the baseline only by what its name says.
BASELINE_ENV: Mapping[str, str] = {
    "TRAIN_PRECISION": "fp32",
    "TRAIN_TF32": "0",
    "TRAIN_OPTIM": "adamw_torch",
    "TRAIN_ATTN": "sdpa",
    "TRAIN_GRAD_CKPT": "0",
    "TRAIN_GRAD_ACCUM": "1",
    "TRAIN_AUTO_BATCH": "0",
    "TRAIN_COMPILE": "0",
    "TRAIN_LIGER": "0",
    "TRAIN_ZERO_STAGE": "0",
    "TRAIN_ZERO_OFFLOAD": "none",
    "TRAIN_DEEPSPEED_CONFIG": "",
    "TRAIN_FSDP": "none",
    "TRAIN_LORA": "0",
    "TRAIN_QUANT": "none",
}

# Groups whose fastest row (when it beats its reference) goes into the `combined` row.
COMBINABLE_GROUPS = ("optim", "attn", "compile", "kernels", "batch")


@dataclass(frozen=True)
class RowSpec:
    name: str
    group: str
    description: str
    env: Mapping[str, str] = field(default_factory=dict)
    # False for rows that train something else (adapters): they are measured, never recommended.
    same_training: bool = True


def _precision_rows() -> list[RowSpec]:
    return [
        RowSpec(BASELINE, "precision", "Baseline: fp32 weights and math, TF32 off, adamw_torch, sdpa attention."),
        RowSpec("tf32", "precision", "fp32 with TensorFloat-32 matmuls (Ampere and newer GPUs).", {"TRAIN_TF32": "1"}),
        RowSpec("fp16", "precision", "fp16 mixed precision with loss scaling (GPUs only).",
                {"TRAIN_PRECISION": "fp16"}),
        RowSpec("bf16", "precision", "bf16 mixed precision (Ampere and newer GPUs; CPUs run it emulated or with AMX).",
                {"TRAIN_PRECISION": "bf16"}),
    ]


_OPTIMIZERS = {
    "adamw_torch": "PyTorch AdamW, one kernel per tensor (the baseline optimizer).",
    "adamw_torch_fused": "PyTorch AdamW with the fused multi-tensor kernel.",
    "adamw_apex_fused": "NVIDIA Apex FusedAdam (needs apex built with its CUDA extensions).",
    "adamw_bnb_8bit": "bitsandbytes 8-bit AdamW: optimizer state in 8 bits (less memory).",
    "adafactor": "Adafactor: factored second moments (less memory, different optimizer).",
}


# The technique variables a user who sets none of them gets: the trainer picks for this machine. With the baseline's
# other values (no checkpointing, accumulation, ZeRO, FSDP, adapters), this is a run with the trainer's defaults.
AUTO_ENV: Mapping[str, str] = {"TRAIN_PRECISION": "auto", "TRAIN_TF32": "auto", "TRAIN_OPTIM": "auto",
                               "TRAIN_ATTN": "auto", "TRAIN_COMPILE": "auto", "TRAIN_AUTO_BATCH": "auto",
                               "TRAIN_LIGER": "auto"}


def _defaults_row() -> list[RowSpec]:
    doc = ("The trainer's defaults (every technique variable at auto; TRAIN_COMPILE as auto decides for a long run): "
           "what a run gets with no tuning. The rows after it are measured on top of it.")
    return [RowSpec(DEFAULTS, "defaults", doc, AUTO_ENV)]


def _optimizer_rows() -> list[RowSpec]:
    return [RowSpec(name, "optim", doc, {"TRAIN_OPTIM": name}) for name, doc in _OPTIMIZERS.items()]


def _memory_rows() -> list[RowSpec]:
    return [
        RowSpec("grad_ckpt", "memory", "Gradient checkpointing: recompute activations in backward (less memory).",
                {"TRAIN_GRAD_CKPT": "1"}),
        RowSpec(GRAD_ACCUM, "memory", "Half the micro-batch, 2 accumulation steps: the same effective batch."),
        RowSpec(MAX_BATCH, "batch", "The largest micro-batch that fits (doubling until out of memory; GPUs only)."),
    ]


_ATTENTION = {
    "eager": "Attention in plain PyTorch ops (materializes the score matrix).",
    "sdpa": "torch.nn.functional.scaled_dot_product_attention (the baseline attention).",
    "flash_attention_2": "FlashAttention-2 kernels (needs flash-attn installed, fp16/bf16, Ampere or newer).",
    "flash_attention_4": "FlashAttention-4 kernels (needs flash-attn-4 installed, fp16/bf16, Hopper or newer).",
}


def _speed_rows() -> list[RowSpec]:
    rows = [RowSpec("compile", "compile", "torch.compile (inductor); the first steps compile, they are warm-up.",
                    {"TRAIN_COMPILE": "1"})]
    rows += [RowSpec(name, "attn", doc, {"TRAIN_ATTN": name}) for name, doc in _ATTENTION.items()]
    rows.append(RowSpec("liger", "kernels", "Liger's fused RMSNorm, SwiGLU, RoPE and cross-entropy (needs "
                                            "liger-kernel and a GPU).", {"TRAIN_LIGER": "1"}))  # fmt: skip
    return rows


_EXPERTS = {
    "eager": "a loop over the experts that received tokens",
    "batched_mm": "each token's experts' weights gathered into one batched matmul (k copies of them per token)",
    "grouped_mm": "tokens sorted by expert, one grouped GEMM per projection (torch's kernel: GPUs of compute "
                  "capability 8.0+, CPUs with torch 2.9+)",
}  # fmt: skip
MOE_ROWS = tuple(f"moe_{name}" for name in _EXPERTS)


def _moe_rows() -> list[RowSpec]:
    """A mixture of experts' experts implementations (TRAIN_MOE_IMPL), each on top of the reference; the same
    training: each row's loss is compared with the first of them that ran."""
    return [RowSpec(f"moe_{name}", "moe", f"TRAIN_MOE_IMPL={name}: {doc} (a mixture of experts in TRAIN_MODEL).",
                    {"TRAIN_MOE_IMPL": name}) for name, doc in _EXPERTS.items()]  # fmt: skip


def _fp8_rows() -> list[RowSpec]:
    doc = ("TRAIN_PRECISION=fp8 on top of the reference, compiled: torchao's float8 matmuls in the decoder's linear "
           "layers (GPUs with FP8 tensor cores); its MFU is bf16-equivalent. Opt-in, never recommended (its numerics "
           "differ: compare rows/fp8/metrics.jsonl's losses with the reference row's).")
    return [RowSpec("fp8", "fp8", doc, {"TRAIN_PRECISION": "fp8", "TRAIN_COMPILE": "1"}, same_training=False)]


def _zero_rows() -> list[RowSpec]:
    rows = []
    sharded = {1: "optimizer state", 2: "optimizer state and gradients", 3: "optimizer state, gradients, parameters"}
    for stage in (1, 2, 3):
        rows.append(RowSpec(f"zero{stage}", "zero", f"DeepSpeed ZeRO stage {stage}: shards {sharded[stage]}.",
                            {"TRAIN_ZERO_STAGE": str(stage)}))
        rows.append(RowSpec(f"zero{stage}_offload", "zero", f"ZeRO stage {stage} with offload to CPU memory.",
                            {"TRAIN_ZERO_STAGE": str(stage), "TRAIN_ZERO_OFFLOAD": "cpu"}))
    return rows


def _adapter_rows() -> list[RowSpec]:
    return [
        RowSpec("lora", "adapters", "LoRA adapters on the pretrained model (trains the adapters only).",
                {"TRAIN_LORA": "1"}, same_training=False),
        RowSpec("qlora", "adapters", "QLoRA: LoRA on the model loaded in 4 bits (bitsandbytes; GPUs only).",
                {"TRAIN_LORA": "1", "TRAIN_QUANT": "4bit"}, same_training=False),
    ]


def _preference_rows() -> list[RowSpec]:
    doc = ("TRAIN_METHOD=dpo/kto: the reference's log-probs computed once before training instead of a frozen copy "
           "held and run each step (less memory, faster steps; the one-time pass is not in the step rate).")
    return [RowSpec(PRECOMPUTED_REFERENCE, "preference", doc, {"TRAIN_PREF_REFERENCE": "precompute"},
                    same_training=False)]  # fmt: skip


def _online_rows() -> list[RowSpec]:
    doc = ("TRAIN_METHOD=grpo/rloo: the reference configuration, its step split into producing the completions "
           "(generating and scoring them) and training on them, in median seconds per step.")
    return [RowSpec(RL_SPLIT, "online_rl", doc, same_training=False)]


def _combined_row() -> list[RowSpec]:
    doc = ("The defaults (`auto`) plus the fastest optimizer, attention, compile, kernels and batch rows that beat "
           "them, measured together.")
    return [RowSpec(COMBINED, "combined", doc)]


def catalogue() -> list[RowSpec]:
    """All rows, in the order they run (precision first: the other rows build on its winner)."""
    return (_precision_rows() + _defaults_row() + _optimizer_rows() + _memory_rows() + _speed_rows() + _moe_rows()
            + _fp8_rows() + _zero_rows() + _adapter_rows() + _preference_rows() + _online_rows() + _combined_row())


def row_names() -> list[str]:
    return [row.name for row in catalogue()]


def group_names() -> list[str]:
    return list(dict.fromkeys(row.group for row in catalogue()))


class UnknownRowError(ValueError):
    pass


def select_rows(selection: str | None) -> list[RowSpec]:
    """Rows named in a comma-separated selection of row or group names (None or 'all': every row).

    The baseline (every relative column divides by it) and the defaults row (the other rows build on it) are always
    included; the catalogue order is kept.
    """
    rows = catalogue()
    if selection is None or selection.strip().lower() == "all":
        return rows
    wanted = {part.strip().lower() for part in selection.split(",") if part.strip()}
    known = set(row_names()) | set(group_names())
    unknown = sorted(wanted - known)
    if unknown:
        raise UnknownRowError(
            f"unknown bench row(s): {', '.join(unknown)}. Valid rows: {', '.join(row_names())}; "
            f"or groups: {', '.join(group_names())} (see `python -m trainer bench --list`)."
        )
    wanted.update((BASELINE, DEFAULTS))
    return [row for row in rows if row.name in wanted or row.group in wanted]
