"""The decisions: every `auto` resolved for this machine, each a typed value with the reason it was chosen.

`Decisions` is what the run, the models and the benchmarks read (`cfg.decisions.attn.value`); its JSON form
(`to_dict`) is the "decisions" table of `python -m trainer config` and of run_config.json.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from trainer import compat, transformers_names
from trainer.compat import FSDP2_RESHARD
from trainer.config import deepspeed, methods, precision, rl_engine, speed
from trainer.config.decision import Decision
from trainer.config.inputs import Inputs
from trainer.config.presets import is_preset
from trainer.config.schema import TrainSettings
from trainer.config.sharding import fsdp_checkpoints_activations, fsdp_wrap_class, uses_fsdp
from trainer.data.chat import chat_report
from trainer.errors import ConfigError
from trainer.machine.gpus import NprocError, processes_per_node
from trainer.machine.hardware import module_available

if TYPE_CHECKING:
    from trainer.machine.hardware import Hardware

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
ALLOC_CONF_DEFAULT = "expandable_segments:True"


@dataclass(frozen=True)
class Decisions:
    """Every decision of a resolved run, in the order `python -m trainer config` shows them."""

    data: Decision[str]
    packing: Decision[str]  # stream, records, or records+stream (plain text streamed, records whole)
    model: Decision[str]
    precision: Decision[str]  # fp32, bf16, fp16 or fp8 (bf16 autocast, float8 linears): config/precision.py
    tf32: Decision[bool]
    deepspeed: Decision[str | None]  # zeroN, a user config path, or None
    optim: Decision[str]  # a Transformers optimizer name, adamw_apex_fused, or "deepspeed"
    attn: Decision[str]  # the attn_implementation given to Transformers
    pin_memory: Decision[bool]
    auto_batch: Decision[bool]
    batch_size: Decision[int]  # per device; the TRAIN_AUTO_BATCH search replaces it when training starts
    grad_accum: Decision[int]  # the search may change it too, keeping the effective batch (run.batch_search)
    nproc_per_node: Decision[int]
    compile: Decision[bool]
    liger: Decision[bool]
    non_blocking: Decision[bool]  # asynchronous host-to-GPU copies of each batch
    nan_inf_filter: Decision[bool]  # Transformers' per-step NaN/Inf read of the loss
    quant: Decision[str]  # none, 4bit, 8bit
    lora: Decision[bool]
    fsdp: Decision[str]
    grad_ckpt: Decision[bool]
    profile: Decision[bool]
    memory_snapshot: Decision[bool]
    deterministic: Decision[bool]
    report_to: Decision[Any]
    resume: Decision[str]
    cuda_alloc_conf: Decision[str]
    args: Decision[dict[str, Any]] = field(default_factory=lambda: Decision({}, "TRAIN_ARGS empty"))
    data_format: Decision[str] = field(default_factory=lambda: Decision("", "not detected"))  # trainer.data.chat
    chat_template: Decision[str] = field(default_factory=lambda: Decision("none", "no conversations"))
    method: Decision[str] = field(default_factory=lambda: Decision("sft", "TRAIN_METHOD=sft"))  # config.methods
    reference: Decision[str] = field(default_factory=lambda: Decision("none", "TRAIN_METHOD=sft"))
    # full or chunked (trainer.model.chunked_loss); a record written before it had the full loss
    cross_entropy: Decision[str] = field(default_factory=lambda: Decision("full", "Transformers' loss"))
    # the predicted peak GPU memory per process and its parts in bytes (config.memory_fit); None: not predicted
    memory: Decision[Any] = field(default_factory=lambda: Decision(None, "not predicted"))

    def to_dict(self) -> dict[str, dict[str, Any]]:
        chosen = {f.name: getattr(self, f.name) for f in fields(self)}
        return {name: {"value": d.value, "reason": d.reason} for name, d in chosen.items()}


def _decide(value: Any, reason: str) -> Decision:
    return Decision(value, reason)


def decide_tf32(s: TrainSettings, hw: Hardware) -> Decision:
    if s.tf32 == "1" and not hw.tf32:
        raise ConfigError(
            f"TRAIN_TF32=1 needs an Ampere or newer GPU (compute capability 8.0+); this is {hw.describe()}"
        )
    if s.tf32 == "1":
        return _decide(True, "set by TRAIN_TF32")
    if s.tf32 == "0":
        return _decide(False, "set by TRAIN_TF32")
    if hw.tf32:
        return _decide(True, "auto: Ampere or newer GPU; TF32 matmuls are ~8x faster than fp32 at negligible cost")
    return _decide(False, "auto: " + ("no CUDA GPU" if not hw.is_gpu else "GPU older than Ampere has no TF32"))


def decide_optim(s: TrainSettings, hw: Hardware, ds: dict[str, Any] | None) -> Decision:
    if ds is not None and deepspeed.replaces_optimizer(ds):
        return _decide("deepspeed", "ZeRO offload: DeepSpeed's AdamW (CPU Adam) replaces TRAIN_OPTIM")
    if s.optim == "auto":
        if hw.is_gpu:
            return _decide("adamw_torch_fused", "auto: fused CUDA AdamW (one kernel for all parameters)")
        if compat.stack().fused_adamw_on_cpu:
            return _decide("adamw_torch_fused", "auto: torch's fused CPU AdamW (Transformers' own default)")
        return _decide("adamw_torch", "auto: no CUDA GPU, and this torch has no fused CPU AdamW")
    cpu_problem = None if hw.is_gpu else compat.cpu_optimizer_problem(s.optim)
    if cpu_problem:
        raise ConfigError(cpu_problem)
    if s.optim == transformers_names.APEX_FUSED and not hw.is_gpu:
        raise ConfigError(
            "TRAIN_OPTIM=adamw_apex_fused needs a CUDA GPU (apex FusedAdam is CUDA only); use adamw_torch"
        )
    return _decide(s.optim, "set by TRAIN_OPTIM")


def decide_pin_memory(s: TrainSettings, hw: Hardware) -> Decision:
    if s.pin_memory != "auto":
        note = "" if hw.is_gpu or s.pin_memory == "0" else " (no effect without a GPU)"
        return _decide(s.pin_memory == "1", "set by TRAIN_PIN_MEMORY" + note)
    if hw.is_gpu:
        return _decide(True, "auto: page-locked host memory makes host-to-GPU copies faster and asynchronous")
    return _decide(False, "auto: no GPU to copy to")


def decide_nproc(s: TrainSettings, hw: Hardware) -> Decision:
    gpus = hw.gpu_count if hw.is_gpu else 0
    try:
        count, reason = processes_per_node(s.nproc_per_node, gpus, f"{gpus} GPU(s) seen by torch")
    except NprocError as exc:
        raise ConfigError(str(exc)) from None
    return _decide(count, reason)


def decide_quant(s: TrainSettings, hw: Hardware) -> Decision:
    if s.quant == "none":
        return _decide("none", "TRAIN_QUANT=none")
    if not hw.is_gpu:
        version = compat.installed_version("bitsandbytes")
        if not compat.bitsandbytes_quantizes_on_cpu():
            raise ConfigError(
                f"TRAIN_QUANT={s.quant} on CPU needs bitsandbytes 0.46+ (CPU backend); {version} is installed"
            )
        return _decide(s.quant, f"set by TRAIN_QUANT; bitsandbytes {version} quantizes on CPU too (slowly)")
    return _decide(s.quant, "set by TRAIN_QUANT (QLoRA: frozen quantized base, LoRA adapters train)")


def decide_debug(s: TrainSettings, hw: Hardware) -> dict[str, Decision]:
    if s.memory_snapshot and not hw.is_gpu:
        raise ConfigError("TRAIN_MEMORY_SNAPSHOT=1 records CUDA allocations and needs a CUDA GPU; set it to 0 on CPU")
    return {
        "profile": _decide(
            s.profile, "torch.profiler traces in OUTPUT_DIR/profile" if s.profile else "TRAIN_PROFILE=0"
        ),
        "memory_snapshot": _decide(
            s.memory_snapshot, "OUTPUT_DIR/memory_snapshot.pickle" if s.memory_snapshot else "TRAIN_MEMORY_SNAPSHOT=0"
        ),
        "deterministic": _decide(
            s.deterministic,
            "full_determinism: deterministic algorithms, slower" if s.deterministic else "seeded, not bit-exact",
        ),
    }


def alloc_conf_decision(environ: Mapping[str, str]) -> tuple[str, Decision]:
    user = environ.get(ALLOC_CONF)
    if user and user != ALLOC_CONF_DEFAULT:
        return user, _decide(user, f"{ALLOC_CONF} set by the user")
    return ALLOC_CONF_DEFAULT, _decide(ALLOC_CONF_DEFAULT, "default: fewer out-of-memory errors from fragmentation")


def decide_report_to(s: TrainSettings) -> Decision:
    """TRAIN_REPORT_TO as Transformers' report_to; a named tracker whose package is missing is a ConfigError (the
    default TensorBoard, when missing, is dropped with that reason: metrics.jsonl is still written)."""
    from trainer.trackers.choice import MODULES, PACKAGES, parse_report_to

    chosen = parse_report_to(s.report_to)
    missing = [t for t in chosen if not any(module_available(m) for m in MODULES[t])]
    if missing == ["tensorboard"] and "report_to" not in s.model_fields_set:
        return _decide("none", "tensorboard is not installed: no TensorBoard logs (metrics.jsonl is still written)")
    if missing:
        need = ", ".join(PACKAGES[t] for t in missing)
        raise ConfigError(f"TRAIN_REPORT_TO={s.report_to}: {need} is not installed in this environment (the images "
                          "have it; outside them: pip install -e '.[train]'), or leave it out of TRAIN_REPORT_TO")
    if not chosen:
        return _decide("none", "TRAIN_REPORT_TO=none: no tracker (metrics.jsonl is still written)")
    where = {"tensorboard": "TensorBoard in OUTPUT_DIR/runs", "wandb": "W&B (WANDB_*)",
             "mlflow": "MLflow (MLFLOW_TRACKING_URI, default OUTPUT_DIR/mlruns)"}  # fmt: skip
    return _decide(chosen, "; ".join(where[t] for t in chosen) + "; rank 0 reports")


def _grad_ckpt_reason(s: TrainSettings) -> str:
    if not s.grad_ckpt:
        return "TRAIN_GRAD_CKPT=0"
    if fsdp_checkpoints_activations(s):
        return "FSDP activation checkpointing (fsdp_config), recomputing activations in the backward pass"
    return "recompute activations in the backward pass (non-reentrant); ~30% slower, much less memory"


def _resume_reason(resume: str) -> str:
    return {
        "auto": "resume from the newest complete checkpoint in the output folder, if any",
        "never": "always start from scratch",
    }.get(resume, "resume from this checkpoint")


def decide_model(inputs: Inputs, preset: bool) -> Decision[str]:
    """The folder (or preset name) the run loads: a Hub ID's value is its snapshot in HF_HOME's cache."""
    s, sources = inputs.settings, inputs.hub
    snap = sources.model
    if snap is None:
        return _decide(s.model, "preset, trained from scratch" if preset else "local folder, loaded offline")
    pinned = sources.pinned.get("model")
    how = f"pinned by {pinned} (resume)" if pinned else f"revision {snap.ref.wanted_revision!r}"
    return _decide(str(snap.path), f"Hub model {snap.ref.repo_id}, {how}: commit {snap.sha}, in the HF_HOME cache")


def _fsdp_reason(s: TrainSettings, hw: Hardware) -> str:
    if not uses_fsdp(s):
        return "TRAIN_FSDP=none"
    wrap = fsdp_wrap_class(s) or "the model's _no_split_modules"
    version = "FSDP2" if s.fsdp in FSDP2_RESHARD else "FSDP1 (deprecated by Transformers; prefer full_shard)"
    # accelerate builds its FSDP plugin for GPU (and other accelerator) worlds only; CPU processes get DDP.
    cpu = "; on CPUs accelerate does not shard: every process trains a whole copy (DDP)" if not hw.is_gpu else ""
    return f"{version} {s.fsdp}, auto-wrapping {wrap}{cpu}"


def decide_packing(inputs: Inputs) -> Decision[str]:
    """TRAIN_PACKING for the data's record layouts (the packer applies the same rule to each piece: DataSpec)."""
    s = inputs.settings
    if methods.on_trl(s):
        return _decide("none", f"TRAIN_METHOD={s.method}: {dict(methods.method_of(s).refuses)['packing']}")
    if inputs.mix.is_mix:  # each source is packed on its own (trainer.data.mix)
        parts = zip(inputs.mix.entries, inputs.mix_sources, strict=True)
        each = [(entry.name, inputs.data_spec.packing_of(part.layouts)) for entry, part in parts]
        return _decide(", ".join(f"{name}: {how}" for name, (how, _) in each),
                       "each source packed on its own: " + "; ".join(f"{name}: {why}" for name, (_, why) in each))
    return _decide(*inputs.data_spec.packing_of(inputs.data.layouts))


def decide_all(
    inputs: Inputs, hw: Hardware, environ: Mapping[str, str], import_heavy: bool = True
) -> tuple[Decisions, dict[str, Any] | None, str]:
    """(decisions, DeepSpeed config or None, PYTORCH_CUDA_ALLOC_CONF value); ConfigError naming every problem."""
    s, source = inputs.settings, inputs.data
    problems = list(source.problems)
    decide = _Collector(problems)
    data = source.decision()
    preset = is_preset(s.model)
    parts: dict[str, Decision] = {}
    parts["precision"] = compute = decide(precision.decide, s, hw, fallback=_decide("fp32", "refused"))
    ds, deepspeed_decision = deepspeed.decide(s, compute.value, inputs.model_folder)
    pin_memory = decide_pin_memory(s, hw)
    auto_batch = speed.decide_auto_batch(s, hw, ds)
    if methods.on_trl(s) and auto_batch.value:  # TRAIN_AUTO_BATCH=1 is refused (methods.option_problems)
        auto_batch = Decision(False, f"TRAIN_METHOD={s.method}: the batch search probes SFT's packed batches; "
                              "TRAIN_BATCH_SIZE is used as set")  # fmt: skip
    alloc_value, alloc_decision = alloc_conf_decision(environ)
    parts |= {
        "data": Decision(data.get("value", ""), data.get("reason", "refused")),
        "packing": decide_packing(inputs),
        "model": (model := decide_model(inputs, preset)),
        "tf32": decide(decide_tf32, s, hw, fallback=_decide(False, "refused")),
        "deepspeed": deepspeed_decision,
        "optim": decide(decide_optim, s, hw, ds, fallback=_decide("adamw_torch", "refused")),
        "attn": decide(speed.decide_attn, s, hw, compute.value, fallback=_decide("sdpa", "refused")),
        "pin_memory": pin_memory,
        "auto_batch": auto_batch,
        "batch_size": speed.decide_batch_size(s, auto_batch.value),
        "grad_accum": speed.decide_grad_accum(s),
        "nproc_per_node": decide(decide_nproc, s, hw, fallback=_decide(1, "refused")),
        "compile": decide(speed.decide_compile, s, hw, ds, import_heavy, fallback=_decide(False, "refused")),
        "liger": (liger := decide(speed.decide_liger, s, hw, model.value, fallback=_decide(False, "refused"))),
        "cross_entropy": decide(
            speed.decide_cross_entropy, s, ds, liger.value, model.value, _tokenizer_folder(inputs),
            fallback=_decide("full", "refused"),
        ),
        "non_blocking": speed.decide_non_blocking(hw, pin_memory.value),
        "nan_inf_filter": speed.decide_nan_inf_filter(hw),
        "quant": decide(decide_quant, s, hw, fallback=_decide("none", "refused")),
        "lora": _decide(
            s.lora, f"r={s.lora_r} alpha={s.lora_alpha} targets={s.lora_targets}" if s.lora else "TRAIN_LORA=0"
        ),
        "fsdp": _decide(s.fsdp, _fsdp_reason(s, hw)),
        "grad_ckpt": _decide(s.grad_ckpt, _grad_ckpt_reason(s)),
        **decide(decide_debug, s, hw, fallback={}),
        "report_to": decide(decide_report_to, s, fallback=_decide("none", "refused")),
        "resume": _decide(s.resume, _resume_reason(s.resume)),
        "cuda_alloc_conf": alloc_decision,
        **{what: Decision(*found) for what, found in _chat_report(inputs).items()},
        "method": methods.decide_method(s),
        "reference": methods.decide_reference(s),
    }
    problems += rl_engine.hardware_problems(s, hw.is_gpu)
    if problems:
        raise ConfigError(*problems)
    return Decisions(**parts), ds, alloc_value


def _tokenizer_folder(inputs: Inputs) -> str | None:
    """The tokenizer's folder when TRAIN_TOKENIZER names one (a preset's rows follow it), else None."""
    return inputs.tokenizer_folder if inputs.settings.tokenizer else None


def _chat_report(inputs: Inputs) -> dict[str, tuple[str, str]]:
    s = inputs.settings
    return chat_report(inputs.data, s.loss_on, s.chat_template, inputs.tokenizer_folder, s.method)


class _Collector:
    """Calls a decide_* function; a ConfigError is recorded (so one run reports every problem) and `fallback` used."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems

    def __call__(self, fn: Callable[..., Any], *args: Any, fallback: Any) -> Any:
        try:
            return fn(*args)
        except ConfigError as exc:
            self.problems.extend(exc.problems)
            return fallback
