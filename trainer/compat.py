"""Every difference between the stacks of the image rows, in one place (transformers 4.46-5.x, torch 2.1-2.x).

The rest of the trainer asks this module, never a version: argument names (`dtype_kwarg`, `checkpointing_name`,
`fsdp_arguments`), adapters for calls that changed (`rotate_checkpoints`, `cuda_bf16_supported`) and the
switches this stack cannot run (`unsupported`), which `trainer.config.checks` refuses with exit 2 and `doctor`
lists. Versions are read with importlib.metadata, so importing this module imports neither torch nor transformers;
inside an image they are the image's own (images/versions.toml is not there).
"""

from __future__ import annotations

import functools
import logging
import os
import re
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Protocol

from trainer import methods

log = logging.getLogger("trainer")
FSDP2_RESHARD = {"full_shard": True, "shard_grad_op": False}  # FSDP2 expresses the strategy as one bool
# TRAIN_METHOD's methods on TRL's trainers (trainer/methods.py: preference and online RL); the oldest TRL whose API
# they use.
TRL_MIN = (1, 16)
# TRAIN_PRECISION=fp8 runs on torchao's float8 training; the rows' oldest torch it is pinned for is 2.6 (torchao
# 0.12.0, built against 2.5 to 2.7). images/versions.toml pins the release for each row's torch.
FP8_TORCH_MIN = (2, 6)
RESPONSE_TEMPLATES = (5, 13)  # transformers with response templates (how TRL parses tool calls): multi-turn RL
IMAGES = "TRAIN_DATA=records with images"  # a data kind a row may not train (trainer.data.vision), as a switch


def _release(dist: str) -> tuple[int, ...] | None:
    """(major, minor, micro) of an installed distribution, ignoring local/pre-release tags (2.1.0a0+nv -> 2.1.0)."""
    try:
        text = metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
    parts = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", text)
    return tuple(int(p or 0) for p in parts.groups()) if parts else None


@dataclass(frozen=True)
class Stack:
    """The installed versions that matter, and what they imply."""

    torch: tuple[int, ...] | None
    transformers: tuple[int, ...] | None
    flash_attn: tuple[int, ...] | None
    trl: tuple[int, ...] | None = TRL_MIN  # None: not installed (the Python 3.10 rows)
    math_verify: tuple[int, ...] | None = (0, 9)  # TRAIN_REWARD=math's verifier; None: not installed (as TRL)
    installed: bool = False  # this environment's (stack()): its transformers' own optimizer names are read

    @property
    def transformers_5(self) -> bool:
        return self.transformers is None or self.transformers >= (5,)

    @property
    def dtype_kwarg(self) -> str:
        """from_pretrained/from_config's dtype argument: `dtype` from transformers 4.56, `torch_dtype` before."""
        return "dtype" if self.transformers is None or self.transformers >= (4, 56) else "torch_dtype"

    @property
    def checkpointing_name(self) -> str:
        """TrainingArguments' activation checkpointing flag: renamed from gradient_checkpointing in transformers 5.18
        (5.17, the CPU RL venv's, vLLM 0.31's bound, has the old name; read from both wheels' training_args.py)."""
        new = self.transformers is None or self.transformers >= (5, 18)
        return "activation_checkpointing" if new else "gradient_checkpointing"

    @property
    def fsdp2(self) -> bool:
        """FSDP2 through TrainingArguments: transformers 5's fsdp_config `version`, and accelerate needs torch 2.6."""
        return self.transformers_5 and (self.torch is None or self.torch >= (2, 6))

    @property
    def packs_by_position_ids(self) -> bool:
        """Whether sdpa/eager attention keeps packed records apart from restarted position_ids alone: transformers 5
        builds a mask per record from them (without a cache). 4.46 never does, 4.57 only on torch >= 2.6; there the
        trainer passes a per-record 4D mask instead (trainer.model.packed_attention)."""
        return self.transformers_5

    @property
    def dropped_training_arguments(self) -> frozenset[str]:
        """TrainingArguments fields transformers 5 removed (safetensors is the only format; TensorBoard writes to
        OUTPUT_DIR/runs by itself): trainkit passes them to the versions that still have them."""
        return frozenset({"save_safetensors", "logging_dir"}) if self.transformers_5 else frozenset()

    @property
    def fused_adamw_on_cpu(self) -> bool:
        """torch.optim.AdamW(fused=True) has a CPU kernel from torch 2.4."""
        return self.torch is None or self.torch >= (2, 4)

    @property
    def refuses_torch_load(self) -> bool:
        """transformers 4.52+ refuses every torch.load on torch < 2.6 (CVE-2025-32434: `weights_only` can be
        bypassed there), a resume's optimizer, scheduler and RNG state included: the 12.4 row (NGC 24.05, torch 2.4)."""
        return (self.transformers is not None and self.transformers >= (4, 52)
                and self.torch is not None and self.torch < (2, 6))  # fmt: skip

    @property
    def processor_offsets(self) -> bool:
        """Processors report where they expanded each image placeholder (`return_text_replacement_offsets`), which
        the loss mask of records with images is moved by: in 5.17 and 5.23's processing_utils.py, not in 4.46's."""
        return self.transformers is None or self.transformers >= (5, 17)

    @property
    def torchrun_stop_wait_configurable(self) -> bool:
        """torchrun reads TORCH_ELASTIC_SHUTDOWN_TIMEOUT from torch 2.12; before, its wait before SIGKILL is 30 s."""
        return self.torch is None or self.torch >= (2, 12)

    @property
    def grouped_mm_on_cpu(self) -> bool:
        """torch's grouped GEMM (a mixture's experts, trainer.config.moe) has a CPU kernel from torch 2.9."""
        return self.torch is None or self.torch >= (2, 9)

    @property
    def bf16_emulation_flag(self) -> bool:
        """torch.cuda.is_bf16_supported(including_emulation=...) exists from torch 2.3."""
        return self.torch is None or self.torch >= (2, 3)

    def describe(self) -> str:
        names = {"torch": self.torch, "transformers": self.transformers}
        stack = ", ".join(f"{k} {'.'.join(map(str, v))}" for k, v in names.items() if v)
        # NGC images set CUDA_VERSION (e.g. 12.1.1). torch's own CUDA build does not name the row: a stand-in's
        # PyPI torch 2.4.1 is a CUDA 12.1 build in the 12.4 row.
        cuda = os.environ.get("CUDA_VERSION", "")
        row = f"the CUDA {'.'.join(cuda.split('.')[:2])} row" if cuda else "this stack"
        return f"{row} ({stack})"


def installed_version(dist: str) -> str | None:
    """The installed version of a distribution as it names itself (e.g. 2.1.0a0+nv23.07), None when absent."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def bitsandbytes_quantizes_on_cpu() -> bool:
    """bitsandbytes has a CPU backend from 0.46 (TRAIN_QUANT on a machine without a GPU)."""
    release = _release("bitsandbytes")
    return release is not None and release[:2] >= (0, 46)


@functools.lru_cache(maxsize=1)
def stack() -> Stack:
    return Stack(_release("torch"), _release("transformers"), _release("flash-attn") or _release("flash_attn"),
                 _release("trl"), _release("math-verify"), installed=True)  # fmt: skip


# ---- switches this stack cannot run: (TRAIN_* variable, value) -> reason ----------------------------------------


def unsupported(st: Stack | None = None) -> dict[str, str]:
    """`TRAIN_X=value` -> why this stack cannot run it (empty on a current stack). Also shown by doctor."""
    st = st or stack()
    out: dict[str, str] = {}
    if st.torch is not None and st.torch < (2, 2):
        out["TRAIN_ATTN=flash_attention_2"] = (
            "flash-attn 2 needs torch >= 2.2 (this row keeps NGC's flash-attn 1 for Transformer Engine); "
            "use TRAIN_ATTN=sdpa"
        )
    elif st.flash_attn is not None and st.flash_attn < (2,):
        out["TRAIN_ATTN=flash_attention_2"] = "the installed flash-attn is 1.x; use TRAIN_ATTN=sdpa"
    if not st.transformers_5:
        out["TRAIN_ATTN=flash_attention_4"] = ("flash_attention_4 is an attention implementation of transformers 5 "
                                               "(flash-attn-4); use TRAIN_ATTN=sdpa")  # fmt: skip
    if not st.fsdp2:
        why = "transformers 5" if not st.transformers_5 else "torch >= 2.6"
        for strategy in FSDP2_RESHARD:
            out[f"TRAIN_FSDP={strategy}"] = (
                f"trainkit runs {strategy} as FSDP2, which needs {why}; use TRAIN_ZERO_STAGE=3 (or 2) for sharding, "
                "or TRAIN_FSDP=hybrid_shard/no_shard (FSDP1)"
            )
    if not st.transformers_5:  # fused experts, Qwen3-MoE: transformers 5's
        out["TRAIN_MODEL=tiny-moe"] = "tiny-moe is a Qwen3-MoE shape (transformers 5); use a row from 12.6 on"
    if st.math_verify is None:
        out["TRAIN_REWARD=math"] = (
            "math-verify (the verifier of the math reward) is installed only where TRL is (Python >= 3.11, as online "
            "RL); use an image row with Python 3.11+ (CUDA 12.6 or newer, or the CPU image)"
        )
    if st.torch is not None and st.torch < FP8_TORCH_MIN:
        out["TRAIN_PRECISION=fp8"] = (
            f"torchao's float8 training needs torch >= {'.'.join(map(str, FP8_TORCH_MIN))} (no torchao release "
            "supports this row's torch); use TRAIN_PRECISION=bf16, or an image row from CUDA 12.6 on"
        )
    old_parser = st.transformers is not None and st.transformers < RESPONSE_TEMPLATES
    if old_parser and st.trl is not None and st.trl >= TRL_MIN:  # (without TRL, TRAIN_METHOD=grpo is refused)
        out["TRAIN_RL_TOOLS"] = out["TRAIN_RL_ENVIRONMENT"] = (
            "multi-turn RL reads the model's tool calls back with a chat template's response template, which "
            "transformers 5.13 brought; use an image row with transformers 5.13 or newer (the CPU image)")
    if not st.processor_offsets:
        out[IMAGES] = ("the loss mask of records with images needs transformers >= 5.17 (its processors report where "
                       "they expanded each image placeholder); use an image row with Python 3.11+ (CUDA 12.6 or newer, "
                       "or the CPU image)")  # fmt: skip
    return out | _methods_unsupported(st) | _optimizers_unsupported(st)


def _methods_unsupported(st: Stack) -> dict[str, str]:
    """The preference methods need TRL >= TRL_MIN, which needs Python >= 3.11 and transformers >= 4.56.2."""
    if st.trl is not None and st.trl >= TRL_MIN:
        return {}
    wanted = ".".join(map(str, TRL_MIN))
    found = "no TRL is installed" if st.trl is None else f"TRL {'.'.join(map(str, st.trl))} is installed"
    why = (f"{found}; the preference and online RL methods use TRL >= {wanted}'s trainers (which need Python >= "
           "3.11 and transformers >= 4.56.2): use an image row with Python 3.11+ (CUDA 12.6 or newer, or the CPU "
           "image)")
    return {f"TRAIN_METHOD={name}": why for name in methods.names(trl=True)}


def flash_attention_2_possible(st: Stack | None = None) -> bool:
    """False where flash-attn 2 cannot run whatever the GPU (e.g. NGC 23.07: flash-attn 1 is installed, torch 2.1)."""
    return "TRAIN_ATTN=flash_attention_2" not in unsupported(st)


def compile_default_problem(st: Stack | None = None) -> str | None:
    """Why TRAIN_COMPILE=auto keeps torch.compile off on this stack (None: compiling a Llama is known to work here).
    From torch 2.6 (the rows with transformers 5) the presets compile without graph breaks; before, set
    TRAIN_COMPILE=1 to try it."""
    st = st or stack()
    if st.torch is not None and st.torch < (2, 6):
        return f"{st.describe()}: torch.compile is on by default from torch 2.6; TRAIN_COMPILE=1 to try it here"
    return None


class Switches(Protocol):
    """The settings a row may not run (trainer.config.schema.TrainSettings has them; this floor cannot import it).
    Read-only, as the frozen settings are: a settable member would ask for exactly `str`, not a Literal of words."""

    @property
    def attn(self) -> str: ...
    @property
    def fsdp(self) -> str: ...
    @property
    def optim(self) -> str: ...
    @property
    def method(self) -> str: ...
    @property
    def precision(self) -> str: ...


def unsupported_problems(settings: Switches, st: Stack | None = None) -> list[str]:
    """The chosen switches this stack cannot run, one message each naming the row and the reason."""
    st = st or stack()
    found = unsupported(st)
    chosen = {f"TRAIN_ATTN={settings.attn}", f"TRAIN_FSDP={settings.fsdp}", f"TRAIN_OPTIM={settings.optim}",
              f"TRAIN_METHOD={settings.method}", f"TRAIN_PRECISION={settings.precision}"}
    return [_refusal(switch, st, found[switch]) for switch in sorted(chosen & set(found))]


def switch_problem(switch: str, st: Stack | None = None) -> str | None:
    """`TRAIN_X=value`'s refusal on this stack as unsupported_problems words it, or None where it runs."""
    st = st or stack()
    reason = unsupported(st).get(switch)
    return None if reason is None else _refusal(switch, st, reason)


def _refusal(switch: str, st: Stack, reason: str) -> str:
    return f"{switch} is not supported on {st.describe()}: {reason}"


def cpu_optimizer_problem(optim: str, st: Stack | None = None) -> str | None:
    """Why `optim` cannot run on the CPU with this stack, or None (a machine-dependent refusal: GPUs are fine)."""
    st = st or stack()
    if optim == "adamw_torch_fused" and not st.fused_adamw_on_cpu:
        return (
            f"TRAIN_OPTIM=adamw_torch_fused on CPU is not supported on {st.describe()}: torch < 2.4 has no CPU kernel "
            "for fused AdamW; use TRAIN_OPTIM=auto or adamw_torch"
        )
    return None


def _optimizers_unsupported(st: Stack) -> dict[str, str]:
    """trainkit's optimizer list is the newest transformers'; an older one refuses the names it does not have: the
    installed one's from its source, a described one's from the release that added each name."""
    from trainer import transformers_names

    installed = installed_optimizer_names() if st.installed else _described_optimizer_names(st)
    if not installed:
        return {}
    version = ".".join(map(str, st.transformers or ()))
    return {
        f"TRAIN_OPTIM={name}": f"transformers {version} has no {name} optimizer (a later version added it); "
        "use TRAIN_OPTIM=auto or adamw_torch"
        for name in transformers_names.OPTIMIZER_NAMES
        if name not in installed
    }


def _described_optimizer_names(st: Stack) -> frozenset[str]:
    from trainer import transformers_names

    added = transformers_names.OPTIMIZERS_ADDED
    return frozenset(name for name in transformers_names.OPTIMIZER_NAMES
                     if st.transformers is None or st.transformers >= added.get(name, (0,)))  # fmt: skip


@functools.lru_cache(maxsize=1)
def installed_optimizer_names() -> frozenset[str]:
    """The values of the installed transformers' OptimizerNames, read from its source (no import); empty if absent."""
    import ast

    from trainer import transformers_names

    source = transformers_names.training_args_source()
    if source is None:
        return frozenset()
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef) and node.name == "OptimizerNames":
            return frozenset(
                item.value.value for item in node.body
                if isinstance(item, ast.Assign) and isinstance(item.value, ast.Constant)
                and isinstance(item.value.value, str)
            )  # fmt: skip
    return frozenset()


# ---- argument names ---------------------------------------------------------------------------------------------


def fsdp_arguments(
    strategy: str, wrap_layer: str | None, grad_ckpt: bool, st: Stack | None = None, *, from_folder: bool = False
) -> dict[str, Any]:
    """TrainingArguments' fsdp/fsdp_config for a TRAIN_FSDP strategy, in this transformers version's own keys.

    `from_folder`: ask for `cpu_ram_efficient_loading` (the same key from 4.46 on), FSDP's broadcast of local rank 0's
    weights when it wraps the model. By reading their source: transformers 4.x then loads the other ranks on the meta
    device; 5.23 still reads the weights on every rank (its loader has no FSDP branch, and ACCELERATE_USE_FSDP, which
    its is_fsdp_enabled() needs, is set only when Trainer builds the Accelerator, after the model), while accelerate
    1.15's FSDP2 loading uses only global rank 0's values. Host RAM per rank was not measured on either."""
    st = st or stack()
    if st.transformers_5:
        if strategy in FSDP2_RESHARD:
            config: dict[str, Any] = {"version": 2, "reshard_after_forward": FSDP2_RESHARD[strategy]}
        else:  # hybrid_shard / no_shard exist only in FSDP1
            config = {"version": 1, "reshard_after_forward": strategy}
        config["auto_wrap_policy"] = "TRANSFORMER_BASED_WRAP"
        fsdp: Any = True
    else:  # 4.x: the strategy and the wrap policy are words of the `fsdp` string; a bare True means one unit
        config = {}
        fsdp = f"{strategy} auto_wrap"
    if wrap_layer:
        config["transformer_layer_cls_to_wrap"] = [wrap_layer]
    if grad_ckpt:
        config["activation_checkpointing"] = True
    if from_folder:
        config["cpu_ram_efficient_loading"] = True
    return {"fsdp": fsdp, "fsdp_config": config}


def model_dtype_kwargs(dtype: Any, st: Stack | None = None) -> dict[str, Any]:
    """{dtype or torch_dtype: dtype} for from_pretrained / from_config."""
    return {(st or stack()).dtype_kwarg: dtype}


def set_rope_scaling(config: Any, params: dict[str, Any], st: Stack | None = None) -> None:
    """Write RoPE scaling into a model config: transformers 5 keeps it in `rope_parameters` (with rope_theta),
    4.x in `rope_scaling` (rope_theta stays a field of its own)."""
    if (st or stack()).transformers_5:
        config.rope_parameters = {**(getattr(config, "rope_parameters", None) or {}), **params}
    else:
        config.rope_scaling = dict(params)


# ---- adapters for calls that changed ----------------------------------------------------------------------------


def out_of_memory_error() -> type[BaseException]:
    """The exception a device allocation that does not fit raises: torch.OutOfMemoryError from torch 2.5 (which
    torch.cuda.OutOfMemoryError names too), torch.cuda.OutOfMemoryError before."""
    import torch

    return getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError


def cuda_bf16_supported() -> bool:
    """Native bf16 on GPU 0 (emulation does not count where torch can tell them apart)."""
    import torch

    if stack().bf16_emulation_flag:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    return bool(torch.cuda.is_bf16_supported())  # torch < 2.3 reports native support only


def rotate_checkpoints(trainer: Any, run_dir: str) -> None:
    """Delete checkpoints beyond save_total_limit: a function in transformers 5, a Trainer method before."""
    if stack().transformers_5:
        from transformers.trainer_utils import rotate_checkpoints as rotate

        rotate(output_dir=run_dir, save_total_limit=trainer.args.save_total_limit,
               best_model_checkpoint=trainer.state.best_model_checkpoint, use_mtime=False)  # fmt: skip
    else:
        trainer._rotate_checkpoints(use_mtime=False, output_dir=run_dir)
