"""TRAIN_* -> a checked, resolved run configuration.

Two stages, so that mistakes are reported before anything heavy is imported:

1. `load_settings(env)`: parse TRAIN_* (unknown names, bad values) and run every check that needs no torch
   (impossible combinations, missing libraries, paths). Fast: imports pydantic only.
2. `resolve(settings, hardware)`: probe the machine (imports torch), decide every `auto` value with a reason, refuse
   what this hardware cannot do, and build the `TrainingArguments` kwargs and the DeepSpeed config.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from trainer import deepspeed_config, training_args
from trainer.data.discovery import source_of
from trainer.errors import ConfigError
from trainer.hardware import module_available
from trainer.launch.gpus import NprocError, processes_per_node
from trainer.schema import ENV_PREFIX, MODEL_PRESETS, TrainSettings, allowed_values, env_name, field_of_env
from trainer.secrets import mask_secrets

if TYPE_CHECKING:
    from trainer.hardware import Hardware

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
ALLOC_CONF_DEFAULT = "expandable_segments:True"
DDP_TIMEOUT_S = 3600  # saving a large sharded checkpoint can outlast the 30 min default
# Environment variables recorded in run_config.json besides TRAIN_* (secrets among them are masked).
RECORDED_ENV_PREFIXES = (
    "TRAIN_", "HF_", "CUDA_", "NCCL_", "TORCH", "PYTORCH_", "TRANSFORMERS_", "TOKENIZERS_", "WANDB_", "OMP_"
)  # fmt: skip


# ================================================================ stage 1: parse


class _MappingSettings(TrainSettings):
    """TrainSettings validated from an explicit mapping only (the base class would also read os.environ)."""

    @classmethod
    def settings_customise_sources(  # type: ignore[override]
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings, **other_sources
    ):
        return (init_settings,)


def train_variables(env: Mapping[str, str]) -> dict[str, str]:
    """The TRAIN_* entries of `env`, upper-cased names; empty values count as unset."""
    return {k.upper(): v for k, v in env.items() if k.upper().startswith(ENV_PREFIX) and v != ""}


def _unknown_names(variables: Mapping[str, str]) -> list[str]:
    known = [env_name(f) for f in TrainSettings.model_fields]
    return [
        f"unknown variable {name}{training_args.did_you_mean(name, known)}; every TRAIN_* variable is listed in "
        "the README and .env.example"
        for name in variables
        if field_of_env(name) is None
    ]


def _describe_validation_error(error: dict[str, Any]) -> str:
    field_name = str(error["loc"][0]) if error.get("loc") else "?"
    name = env_name(field_name)
    value = error.get("input")
    if error["type"] == "literal_error":
        return f"{name}={value!r} is not allowed; allowed values: {allowed_values(field_name)}"
    reason = error["msg"].removeprefix("Value error, ")
    allowed = allowed_values(field_name) if field_name in TrainSettings.model_fields else ""
    return f"{name}={value!r}: {reason[0].lower()}{reason[1:]}" + (f"; allowed values: {allowed}" if allowed else "")


def parse_settings(env: Mapping[str, str] | None = None) -> TrainSettings:
    """TRAIN_* -> TrainSettings; every unknown name and bad value becomes one line of a ConfigError."""
    variables = train_variables(os.environ if env is None else env)
    problems = _unknown_names(variables)
    values = {field_of_env(k): v for k, v in variables.items() if field_of_env(k)}
    try:
        settings = _MappingSettings(**values)
    except ValidationError as exc:
        raise ConfigError(*problems, *(_describe_validation_error(e) for e in exc.errors())) from None
    if problems:
        raise ConfigError(*problems)
    return settings


def load_settings(env: Mapping[str, str] | None = None) -> TrainSettings:
    """Parse TRAIN_* from `env` (os.environ by default) and run every check that needs no torch."""
    settings = parse_settings(env)
    problems = static_problems(settings)
    if problems:
        raise ConfigError(*problems)
    return settings


# ================================================================ stage 1: checks without torch


def _combination_problems(s: TrainSettings) -> list[str]:
    problems = []
    if s.zero_offload != "none" and s.zero_stage == 0:
        problems.append(
            f"TRAIN_ZERO_OFFLOAD={s.zero_offload} needs DeepSpeed ZeRO: set TRAIN_ZERO_STAGE to 1, 2 or 3 "
            "(offload moves ZeRO-partitioned state), or TRAIN_ZERO_OFFLOAD=none"
        )
    if s.zero_offload == "nvme" and s.zero_stage not in (0, 3):
        problems.append(
            f"TRAIN_ZERO_OFFLOAD=nvme needs TRAIN_ZERO_STAGE=3 (DeepSpeed offloads to NVMe only in ZeRO-3, "
            f"not stage {s.zero_stage}); use TRAIN_ZERO_OFFLOAD=cpu for stages 1-2"
        )
    uses_deepspeed = s.zero_stage > 0 or bool(s.deepspeed_config)
    if uses_deepspeed and s.fsdp != "none":
        problems.append(
            f"TRAIN_FSDP={s.fsdp} and DeepSpeed (TRAIN_ZERO_STAGE/TRAIN_DEEPSPEED_CONFIG) both shard the model; "
            "pick one: TRAIN_FSDP=none or TRAIN_ZERO_STAGE=0"
        )
    if s.quant != "none" and not s.lora:
        problems.append(
            f"TRAIN_QUANT={s.quant} needs TRAIN_LORA=1: quantized weights are frozen, only LoRA adapters train (QLoRA)"
        )
    if s.compile and s.zero_stage == 3:
        problems.append(
            "TRAIN_COMPILE=1 with TRAIN_ZERO_STAGE=3: ZeRO-3 gathers parameters in hooks that break torch.compile "
            "graphs; use TRAIN_ZERO_STAGE=2 or TRAIN_COMPILE=0"
        )
    if s.auto_batch and uses_deepspeed:
        problems.append(
            "TRAIN_AUTO_BATCH=1 does not work with DeepSpeed (its batch size is fixed at initialization); "
            "set TRAIN_BATCH_SIZE yourself or TRAIN_ZERO_STAGE=0"
        )
    return problems


def _library_problems(s: TrainSettings) -> list[str]:
    needs = []
    if s.zero_stage > 0 or s.deepspeed_config:
        needs.append(("deepspeed", "TRAIN_ZERO_STAGE/TRAIN_DEEPSPEED_CONFIG", "pip install deepspeed"))
    if s.lora:
        needs.append(("peft", "TRAIN_LORA=1", "pip install peft"))
    if s.quant != "none":
        needs.append(("bitsandbytes", f"TRAIN_QUANT={s.quant}", "pip install bitsandbytes"))
    return [
        f"{setting} needs the Python package {module!r}, which is not installed ({hint})"
        for module, setting, hint in needs
        if not module_available(module)
    ]


def _optimizer_problems(s: TrainSettings) -> list[str]:
    if s.optim == "auto":
        return []
    names = training_args.all_optimizer_names()
    if s.optim not in names:
        return [
            f"TRAIN_OPTIM={s.optim!r} is not an optimizer Transformers knows"
            f"{training_args.did_you_mean(s.optim, names)}; "
            "e.g. adamw_torch, adamw_torch_fused, adamw_apex_fused, adamw_bnb_8bit, adafactor"
        ]
    library = training_args.optimizer_library(s.optim)
    if library is None:
        return []
    module, hint = library
    available = module_available(module) and (s.optim != training_args.APEX_FUSED or module_available("amp_C"))
    if available:
        return []
    return [f"TRAIN_OPTIM={s.optim} needs {module!r}, which is not installed ({hint}); or use TRAIN_OPTIM=auto"]


def _deepspeed_config_problems(s: TrainSettings) -> list[str]:
    if not s.deepspeed_config:
        return []
    try:
        deepspeed_config.load_user_config(s.deepspeed_config)
    except ConfigError as exc:
        return exc.problems
    return []


def _train_args_problems(s: TrainSettings) -> list[str]:
    try:
        return training_args.check_train_args(training_args.split_train_args(s.args))
    except ConfigError as exc:
        return exc.problems


def _model_problems(s: TrainSettings) -> list[str]:
    if s.model in MODEL_PRESETS:
        return []
    folder = Path(s.model)
    if not folder.exists():
        return [
            f"TRAIN_MODEL={s.model!r} is neither a preset ({', '.join(MODEL_PRESETS)}) nor an existing folder; "
            "mount the model (e.g. -v /path/to/model:/models/name:ro) or use a preset"
        ]
    if not (folder / "config.json").is_file():
        return [f"TRAIN_MODEL={s.model}: the folder has no config.json; point it at a Hugging Face model folder"]
    if not _readable(folder / "config.json"):
        return [f"TRAIN_MODEL={s.model}: cannot read config.json; check the file's permissions"]
    return []


def _resume_problems(s: TrainSettings) -> list[str]:
    if s.resume in ("auto", "never"):
        return []
    if not Path(s.resume).is_dir():
        return [
            f"TRAIN_RESUME={s.resume!r}: no such checkpoint folder; use auto, never or an existing checkpoint-N path"
        ]
    return []


def _writable_dir_problem(name: str, path: str) -> str | None:
    """None when `path` is (or can be created as) a writable folder; else why not. Tries a real write: root passes
    every permission check, read-only mounts and files in the way do not."""
    target = Path(path)
    probe_dir = target
    while not probe_dir.exists():
        if probe_dir.parent == probe_dir:
            break
        probe_dir = probe_dir.parent
    if not probe_dir.is_dir():
        return f"{name}={path}: {probe_dir} is a file, not a folder; choose a folder path"
    try:
        with tempfile.NamedTemporaryFile(dir=probe_dir, prefix=".trainkit-write-test-"):
            pass
    except OSError as exc:
        where = "" if probe_dir == target else f" (its nearest existing parent {probe_dir})"
        return (
            f"{name}={path}: the folder{where} is not writable ({exc.strerror}); mount a writable folder there or "
            "run the container with a user that may write it"
        )
    return None


def _output_problems(s: TrainSettings) -> list[str]:
    problem = _writable_dir_problem("TRAIN_OUTPUT_DIR", s.output_dir)
    return [problem] if problem else []


def _nvme_problems(s: TrainSettings) -> list[str]:
    if s.zero_offload != "nvme":
        return []
    if not Path(s.nvme_path).is_dir():
        return [f"TRAIN_NVME_PATH={s.nvme_path}: no such folder; mount a folder on a fast local NVMe disk there"]
    problem = _writable_dir_problem("TRAIN_NVME_PATH", s.nvme_path)
    return [problem] if problem else []


def _readable(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            handle.read(1)
    except OSError:
        return False
    return True


# ---- data (discovery and its checks live in trainer.data.discovery; one scan per settings object) -----------------


def inspect_data(s: TrainSettings) -> tuple[dict[str, Any], list[str]]:
    """The data decision ({value, reason}) and the problems with TRAIN_DATA."""
    source = source_of(s)
    return source.decision(), list(source.problems)


def _data_problems(s: TrainSettings) -> list[str]:
    return inspect_data(s)[1]


STATIC_CHECKS: tuple[Callable[[TrainSettings], list[str]], ...] = (
    _combination_problems,
    _library_problems,
    _optimizer_problems,
    _deepspeed_config_problems,
    _train_args_problems,
    _model_problems,
    _resume_problems,
    _nvme_problems,
    _output_problems,
    _data_problems,
)


def static_problems(settings: TrainSettings) -> list[str]:
    """Every problem that can be found without torch, in a stable order."""
    return [problem for check in STATIC_CHECKS for problem in check(settings)]


# ================================================================ stage 2: resolve on this hardware


@dataclass
class RunConfig:
    """The resolved run: settings, every derived decision with its reason, and what Transformers is given."""

    settings: TrainSettings
    hardware: Hardware
    decisions: dict[str, dict[str, Any]]
    training_arguments: dict[str, Any]
    deepspeed: dict[str, Any] | None = None
    env: dict[str, str] = field(default_factory=dict)  # process environment the run sets (before torch)

    def value(self, name: str, default: Any = None) -> Any:
        """The decided value of `name` ("precision", "attn", "optim", "data", ...)."""
        return self.decisions.get(name, {}).get("value", default)

    def to_dict(self, masked: bool = True, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
        source = self.settings.model_fields_set
        data = {
            "settings": {
                env_name(name): {"value": value, "source": "env" if name in source else "default"}
                for name, value in self.settings.model_dump().items()
            },
            "decisions": self.decisions,
            "hardware": self.hardware.to_dict(),
            "training_arguments": self.training_arguments,
            "deepspeed": self.deepspeed,
            "environment": {**recorded_environment(os.environ if environ is None else environ), **self.env},
        }
        data = json.loads(json.dumps(data, default=str))
        return mask_secrets(data) if masked else data

    def write_run_config(self, output_dir: str | Path | None = None) -> Path:
        """OUTPUT_DIR/run_config.json (secrets masked), written atomically."""
        folder = Path(output_dir or self.settings.output_dir)
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / "run_config.json"
        tmp = target.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_dict(masked=True), indent=2, sort_keys=False) + "\n", encoding="utf-8")
        os.replace(tmp, target)
        return target


def write_run_config(cfg: RunConfig, output_dir: str | Path | None = None) -> Path:
    """Module-level form of RunConfig.write_run_config."""
    return cfg.write_run_config(output_dir)


def recorded_environment(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(environ.items()) if k.startswith(RECORDED_ENV_PREFIXES)}


# ---- decisions ----------------------------------------------------------------------------------------------------


def _decide(value: Any, reason: str) -> dict[str, Any]:
    return {"value": value, "reason": reason}


def decide_precision(s: TrainSettings, hw: Hardware) -> dict[str, Any]:
    if s.precision == "auto":
        if not hw.is_gpu:
            return _decide("fp32", "auto: no CUDA GPU; mixed precision would not speed up CPU training")
        if hw.bf16:
            return _decide("bf16", f"auto: {hw.gpu_name} supports bf16 (same range as fp32, no loss scaling)")
        return _decide("fp16", f"auto: {hw.gpu_name} has no bf16; fp16 with loss scaling")
    if s.precision == "fp16" and not hw.is_gpu:
        raise ConfigError("TRAIN_PRECISION=fp16 needs a CUDA GPU (no fp16 mixed precision on CPU); use fp32 or bf16")
    if s.precision == "bf16" and hw.is_gpu and not hw.bf16:
        raise ConfigError(
            f"TRAIN_PRECISION=bf16: {hw.describe()} has no bf16 support (needs compute capability 8.0+); use fp16"
        )
    where = "CPU autocast" if not hw.is_gpu else hw.gpu_name
    return _decide(s.precision, f"set by TRAIN_PRECISION ({where})")


def decide_tf32(s: TrainSettings, hw: Hardware) -> dict[str, Any]:
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


def decide_optim(s: TrainSettings, hw: Hardware, ds: dict[str, Any] | None) -> dict[str, Any]:
    if ds is not None and deepspeed_config.replaces_optimizer(ds):
        return _decide("deepspeed", "ZeRO offload: DeepSpeed's AdamW (CPU Adam) replaces TRAIN_OPTIM")
    if s.optim == "auto":
        if hw.is_gpu:
            return _decide("adamw_torch_fused", "auto: fused CUDA AdamW (one kernel for all parameters)")
        return _decide("adamw_torch", "auto: no CUDA GPU")
    if s.optim == training_args.APEX_FUSED and not hw.is_gpu:
        raise ConfigError(
            "TRAIN_OPTIM=adamw_apex_fused needs a CUDA GPU (apex FusedAdam is CUDA only); use adamw_torch"
        )
    return _decide(s.optim, "set by TRAIN_OPTIM")


def decide_attn(s: TrainSettings, hw: Hardware, precision: str) -> dict[str, Any]:
    has_flash = hw.libraries.get("flash_attn", False)
    if s.attn == "flash_attention_2":
        if not has_flash:
            raise ConfigError(
                "TRAIN_ATTN=flash_attention_2 needs the flash_attn package, which is not installed; "
                "use TRAIN_ATTN=sdpa (or auto), or an image built with flash-attn"
            )
        if not hw.ampere_or_newer:
            raise ConfigError(
                f"TRAIN_ATTN=flash_attention_2 needs an Ampere or newer GPU; this is {hw.describe()}; use sdpa"
            )
        if precision == "fp32":
            raise ConfigError(
                "TRAIN_ATTN=flash_attention_2 works in fp16/bf16 only; set TRAIN_PRECISION=bf16 or use sdpa"
            )
    if s.attn != "auto":
        return _decide(s.attn, "set by TRAIN_ATTN")
    if has_flash and hw.ampere_or_newer and precision != "fp32":
        return _decide("flash_attention_2", "auto: flash_attn is installed and the GPU is Ampere or newer")
    why = "flash_attn not installed" if not has_flash else "needs an Ampere+ GPU and fp16/bf16"
    return _decide("sdpa", f"auto: PyTorch scaled_dot_product_attention ({why})")


def decide_pin_memory(s: TrainSettings, hw: Hardware) -> dict[str, Any]:
    if s.pin_memory != "auto":
        note = "" if hw.is_gpu or s.pin_memory == "0" else " (no effect without a GPU)"
        return _decide(s.pin_memory == "1", "set by TRAIN_PIN_MEMORY" + note)
    if hw.is_gpu:
        return _decide(True, "auto: page-locked host memory makes host-to-GPU copies faster and asynchronous")
    return _decide(False, "auto: no GPU to copy to")


def decide_nproc(s: TrainSettings, hw: Hardware) -> dict[str, Any]:
    gpus = hw.gpu_count if hw.is_gpu else 0
    try:
        count, reason = processes_per_node(s.nproc_per_node, gpus, f"{gpus} GPU(s) seen by torch")
    except NprocError as exc:
        raise ConfigError(str(exc)) from None
    return _decide(count, reason)


def decide_compile(s: TrainSettings, hw: Hardware, check_backend: bool = True) -> dict[str, Any]:
    if not s.compile:
        return _decide(False, "TRAIN_COMPILE=0")
    if check_backend:
        import torch._dynamo

        if s.compile_backend not in torch._dynamo.list_backends(exclude_tags=()):
            usual = torch._dynamo.list_backends()  # without debug/experimental ones
            raise ConfigError(
                f"TRAIN_COMPILE_BACKEND={s.compile_backend!r} is not a torch.compile backend"
                f"{training_args.did_you_mean(s.compile_backend, usual)}; usual ones: {', '.join(usual)}"
            )
    if s.compile_backend == "inductor":
        if not hw.is_gpu and not hw.cxx_compiler:
            raise ConfigError(
                "TRAIN_COMPILE=1 on CPU: inductor needs a C++ compiler (g++), none found; set TRAIN_COMPILE=0"
            )
        if hw.is_gpu and not hw.libraries.get("triton", False):
            raise ConfigError("TRAIN_COMPILE=1 on GPU: inductor needs triton, which is not installed; TRAIN_COMPILE=0")
    note = ""
    if s.compile_mode == "reduce-overhead" and not hw.is_gpu:
        note = "; CUDA graphs are skipped on CPU, so reduce-overhead behaves like default"
    return _decide(True, f"set by TRAIN_COMPILE (backend {s.compile_backend}, mode {s.compile_mode}){note}")


def decide_quant(s: TrainSettings, hw: Hardware) -> dict[str, Any]:
    if s.quant == "none":
        return _decide("none", "TRAIN_QUANT=none")
    if not hw.is_gpu:
        version = metadata.version("bitsandbytes")
        major, minor = (int(x) for x in version.split(".")[:2])
        if (major, minor) < (0, 46):
            raise ConfigError(
                f"TRAIN_QUANT={s.quant} on CPU needs bitsandbytes 0.46+ (CPU backend); {version} is installed"
            )
        return _decide(s.quant, f"set by TRAIN_QUANT; bitsandbytes {version} quantizes on CPU too (slowly)")
    return _decide(s.quant, "set by TRAIN_QUANT (QLoRA: frozen quantized base, LoRA adapters train)")


def decide_debug(s: TrainSettings, hw: Hardware) -> dict[str, dict[str, Any]]:
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


def decide_deepspeed(s: TrainSettings, precision: str) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    if s.deepspeed_config:
        return deepspeed_config.load_user_config(s.deepspeed_config), _decide(
            s.deepspeed_config, "TRAIN_DEEPSPEED_CONFIG wins over the generated config"
        )
    if s.zero_stage == 0:
        return None, _decide(None, "TRAIN_ZERO_STAGE=0: no DeepSpeed")
    ds = deepspeed_config.generate(s.zero_stage, s.zero_offload, s.nvme_path, precision)
    return ds, _decide(f"zero{s.zero_stage}", f"generated: ZeRO-{s.zero_stage}, offload {s.zero_offload}")


def alloc_conf_decision(environ: Mapping[str, str]) -> tuple[str, dict[str, Any]]:
    user = environ.get(ALLOC_CONF)
    if user and user != ALLOC_CONF_DEFAULT:
        return user, _decide(user, f"{ALLOC_CONF} set by the user")
    return ALLOC_CONF_DEFAULT, _decide(ALLOC_CONF_DEFAULT, "default: fewer out-of-memory errors from fragmentation")


def apply_process_defaults(environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """Environment the training process needs before torch is imported (the user's value wins)."""
    environ.setdefault(ALLOC_CONF, ALLOC_CONF_DEFAULT)


# ---- TrainingArguments ---------------------------------------------------------------------------------------------


FSDP2_RESHARD = {"full_shard": True, "shard_grad_op": False}  # FSDP2 expresses the strategy as one bool


def _fsdp_arguments(s: TrainSettings) -> dict[str, Any]:
    if s.fsdp == "none":
        return {}
    if s.fsdp in FSDP2_RESHARD:
        fsdp_config: dict[str, Any] = {"version": 2, "reshard_after_forward": FSDP2_RESHARD[s.fsdp]}
    else:  # hybrid_shard / no_shard exist only in FSDP1
        fsdp_config = {"version": 1, "reshard_after_forward": s.fsdp}
    fsdp_config["auto_wrap_policy"] = "TRANSFORMER_BASED_WRAP"
    if s.model in MODEL_PRESETS:
        fsdp_config["transformer_layer_cls_to_wrap"] = ["LlamaDecoderLayer"]
    if s.grad_ckpt:
        fsdp_config["activation_checkpointing"] = True
    return {"fsdp": True, "fsdp_config": fsdp_config}


def _fsdp_reason(s: TrainSettings) -> str:
    if s.fsdp == "none":
        return "TRAIN_FSDP=none"
    wrap = "LlamaDecoderLayer" if s.model in MODEL_PRESETS else "the model's _no_split_modules"
    version = "FSDP2" if s.fsdp in FSDP2_RESHARD else "FSDP1 (deprecated by Transformers; prefer full_shard)"
    return f"{version} {s.fsdp}, auto-wrapping {wrap}"


def _checkpointing_arguments(s: TrainSettings, fields: frozenset[str]) -> dict[str, Any]:
    if s.fsdp != "none" and s.grad_ckpt:
        return {}  # FSDP checkpoints activations itself (fsdp_config), avoiding redundant all-gathers
    new_name = "activation_checkpointing" in fields or not fields  # Transformers 5 renamed gradient_checkpointing
    name = "activation_checkpointing" if new_name else "gradient_checkpointing"
    args: dict[str, Any] = {name: s.grad_ckpt}
    if s.grad_ckpt:
        args[f"{name}_kwargs"] = {"use_reentrant": False}
    return args


def _compile_arguments(s: TrainSettings) -> dict[str, Any]:
    # Transformers turns torch_compile on when a backend or mode is given, so pass them only when compiling.
    if not s.compile:
        return {"torch_compile": False}
    return {"torch_compile": True, "torch_compile_backend": s.compile_backend, "torch_compile_mode": s.compile_mode}


def derived_training_arguments(
    s: TrainSettings, hw: Hardware, decisions: Mapping[str, dict[str, Any]], ds: dict[str, Any] | None
) -> dict[str, Any]:
    """TrainingArguments kwargs from TRAIN_* and the decisions (before TRAIN_ARGS)."""
    fields = training_args.training_argument_fields()
    precision = decisions["precision"]["value"]
    optim = decisions["optim"]["value"]
    args: dict[str, Any] = {
        "output_dir": s.output_dir,
        "per_device_train_batch_size": s.batch_size,
        "gradient_accumulation_steps": s.grad_accum,
        "auto_find_batch_size": s.auto_batch,
        "learning_rate": s.lr,
        "max_steps": s.max_steps,
        "num_train_epochs": s.epochs,
        "save_strategy": "steps",
        "save_steps": s.save_steps,
        "save_total_limit": s.save_total_limit,
        "save_safetensors": True,
        "logging_strategy": "steps",
        "logging_steps": s.log_steps,
        "logging_first_step": True,
        "logging_dir": str(Path(s.output_dir) / "runs"),
        "report_to": decisions["report_to"]["value"],
        "seed": s.seed,
        "full_determinism": s.deterministic,
        "bf16": precision == "bf16",
        "fp16": precision == "fp16",
        "tf32": decisions["tf32"]["value"] if hw.is_gpu else None,
        "optim": "adamw_torch" if optim in ("deepspeed", training_args.APEX_FUSED) else optim,
        "dataloader_num_workers": s.num_workers,
        "dataloader_pin_memory": decisions["pin_memory"]["value"],
        "dataloader_persistent_workers": s.num_workers > 0,
        "remove_unused_columns": False,
        "ddp_timeout": DDP_TIMEOUT_S,
        "use_cpu": not hw.is_gpu,
        "neftune_noise_alpha": s.neftune_alpha or None,
        "deepspeed": ds,
        **_checkpointing_arguments(s, fields),
        **_compile_arguments(s),
        **_fsdp_arguments(s),
    }
    # Keep what this Transformers version has (v5 dropped save_safetensors and logging_dir, for instance).
    return {k: v for k, v in args.items() if not fields or k in fields}


def _apply_user_arguments(
    s: TrainSettings, derived: dict[str, Any], parse: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """TRAIN_ARGS on top of the derived kwargs: the user's flags win, and the decision says which ones did."""
    tokens = training_args.split_train_args(s.args)
    if not tokens:
        return derived, _decide({}, "TRAIN_ARGS empty")
    user = training_args.parse_train_args(tokens) if parse else {}
    overridden = sorted(k for k in user if k in derived and derived[k] != user[k])
    reason = "TrainingArguments flags from TRAIN_ARGS; they win over derived values"
    if overridden:
        reason += " (overrode: " + ", ".join(overridden) + ")"
    return {**derived, **user}, _decide(user, reason)


def _report_to() -> dict[str, Any]:
    if module_available("tensorboard") or module_available("tensorboardX"):
        return _decide(["tensorboard"], "TensorBoard logs in OUTPUT_DIR/runs")
    return _decide("none", "tensorboard is not installed: no TensorBoard logs (metrics.jsonl is still written)")


def resolve(
    settings: TrainSettings,
    hardware: Hardware | None = None,
    environ: Mapping[str, str] | None = None,
    import_heavy: bool = True,
) -> RunConfig:
    """Decide every `auto` for this machine and build TrainingArguments kwargs; ConfigError if it cannot work here.

    `import_heavy=False` skips what needs transformers/torch (TRAIN_ARGS parsing, compile backend listing): for
    unit tests of the decision logic on a described machine.
    """
    from trainer import hardware as hardware_module

    hw = hardware or hardware_module.probe()
    s = settings
    environ = os.environ if environ is None else environ
    data_decision, problems = inspect_data(s)
    decide = _Collector(problems)
    decisions: dict[str, dict[str, Any]] = {"data": data_decision}
    preset = s.model in MODEL_PRESETS
    decisions["model"] = _decide(s.model, "preset, trained from scratch" if preset else "local folder, loaded offline")
    decisions["precision"] = decide(decide_precision, s, hw, fallback=_decide("fp32", "refused"))
    precision = decisions["precision"]["value"]
    decisions["tf32"] = decide(decide_tf32, s, hw, fallback=_decide(False, "refused"))
    ds, decisions["deepspeed"] = decide_deepspeed(s, precision)
    decisions["optim"] = decide(decide_optim, s, hw, ds, fallback=_decide("adamw_torch", "refused"))
    decisions["attn"] = decide(decide_attn, s, hw, precision, fallback=_decide("sdpa", "refused"))
    decisions["pin_memory"] = decide_pin_memory(s, hw)
    decisions["nproc_per_node"] = decide(decide_nproc, s, hw, fallback=_decide(1, "refused"))
    decisions["compile"] = decide(decide_compile, s, hw, import_heavy, fallback=_decide(False, "refused"))
    decisions["quant"] = decide(decide_quant, s, hw, fallback=_decide("none", "refused"))
    decisions["lora"] = _decide(
        s.lora, f"r={s.lora_r} alpha={s.lora_alpha} targets={s.lora_targets}" if s.lora else "TRAIN_LORA=0"
    )
    decisions["fsdp"] = _decide(s.fsdp, _fsdp_reason(s))
    decisions["grad_ckpt"] = _decide(s.grad_ckpt, _grad_ckpt_reason(s))
    decisions.update(decide(decide_debug, s, hw, fallback={}))
    decisions["report_to"] = _report_to()
    decisions["resume"] = _decide(s.resume, _resume_reason(s.resume))
    alloc_value, decisions["cuda_alloc_conf"] = alloc_conf_decision(environ)
    if problems:
        raise ConfigError(*problems)
    derived = derived_training_arguments(s, hw, decisions, ds)
    arguments, decisions["args"] = _apply_user_arguments(s, derived, parse=import_heavy)
    return RunConfig(s, hw, decisions, arguments, ds, env={ALLOC_CONF: alloc_value})


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


def _grad_ckpt_reason(s: TrainSettings) -> str:
    if not s.grad_ckpt:
        return "TRAIN_GRAD_CKPT=0"
    if s.fsdp != "none":
        return "FSDP activation checkpointing (fsdp_config), recomputing activations in the backward pass"
    return "recompute activations in the backward pass (non-reentrant); ~30% slower, much less memory"


def _resume_reason(resume: str) -> str:
    return {
        "auto": "resume from the newest complete checkpoint in the output folder, if any",
        "never": "always start from scratch",
    }.get(resume, "resume from this checkpoint")


def build_training_arguments(cfg: RunConfig) -> Any:
    """transformers.TrainingArguments(**cfg.training_arguments); its refusals become a ConfigError (exit 2)."""
    import copy

    from transformers import TrainingArguments

    try:  # a copy: TrainingArguments fills nested dicts (fsdp_config, deepspeed) in place
        return TrainingArguments(**copy.deepcopy(cfg.training_arguments))
    except (ValueError, TypeError, ImportError) as exc:
        raise ConfigError(f"TrainingArguments refused the configuration: {exc}") from None
