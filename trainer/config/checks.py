"""Stage 1: every check of the settings that needs no torch (combinations, libraries, paths, data)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from trainer import compat, transformers_names
from trainer.config import deepspeed, methods, speed
from trainer.config.inputs import Inputs
from trainer.config.presets import MODEL_PRESETS, is_preset
from trainer.config.rope import readable_model_config, rope_problems
from trainer.config.schema import TrainSettings
from trainer.data.chat import template_problems
from trainer.data.mix import eval_set_problems, parse_eval_sets, parse_mix
from trainer.errors import ConfigError
from trainer.hub.push import push_problems
from trainer.hub.sources import TOKENIZER_FILES, hub_ref
from trainer.machine.hardware import module_available
from trainer.methods import names


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
    if s.fsdp != "none" and (s.optim in transformers_names.BNB_OPTIMIZERS or s.optim == transformers_names.APEX_FUSED):
        problems.append(
            f"TRAIN_OPTIM={s.optim} with TRAIN_FSDP={s.fsdp}: its fused kernels take plain tensors, not FSDP's sharded "
            "DTensor parameters (bitsandbytes #1633, #89); use TRAIN_OPTIM=adamw_torch_fused (or auto) with FSDP"
        )
    if s.quant != "none" and s.zero_stage == 3:
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
    if s.quant != "none" and not s.lora:
        problems.append(
            f"TRAIN_QUANT={s.quant} needs TRAIN_LORA=1: quantized weights are frozen, only LoRA adapters train (QLoRA)"
        )
    backend = speed.backend_problem(s, module_available)
    if backend:
        problems.append(backend)
    if s.compile == "1" and s.zero_stage == 3:
        problems.append(
            "TRAIN_COMPILE=1 with TRAIN_ZERO_STAGE=3: ZeRO-3 gathers parameters in hooks that break torch.compile "
            "graphs; use TRAIN_ZERO_STAGE=2 or TRAIN_COMPILE=0"
        )
    if s.auto_batch == "1" and uses_deepspeed:
        problems.append(
            "TRAIN_AUTO_BATCH=1 does not work with DeepSpeed (its batch size is fixed at initialization); "
            "set TRAIN_BATCH_SIZE yourself or TRAIN_ZERO_STAGE=0"
        )
    if s.auto_batch == "1" and s.fsdp != "none":
        problems.append(
            f"TRAIN_AUTO_BATCH=1 does not work with TRAIN_FSDP={s.fsdp} (the search probes the whole model on each "
            "GPU, before FSDP shards it); set TRAIN_BATCH_SIZE yourself or TRAIN_FSDP=none"
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


def _deepspeed_config_problems(s: TrainSettings) -> list[str]:
    if not s.deepspeed_config:
        return []
    try:
        deepspeed.load_user_config(s.deepspeed_config)
    except ConfigError as exc:
        return exc.problems
    return []


def _train_args_problems(s: TrainSettings) -> list[str]:
    try:
        tokens = transformers_names.split_train_args(s.args)
        if methods.on_trl(s):
            owner = f"TRL {methods.config_name(s)}"
            return transformers_names.check_train_args(tokens, methods.config_fields(s.method), owner)
        return transformers_names.check_train_args(tokens)
    except ConfigError as exc:
        return exc.problems


def _model_problems(s: TrainSettings) -> list[str]:
    if is_preset(s.model) or hub_ref(s.model) is not None:
        return []
    folder = Path(s.model)
    if not folder.exists():
        return [
            f"TRAIN_MODEL={s.model!r} is neither a preset ({', '.join(MODEL_PRESETS)}), an existing folder nor a "
            "Hub ID (org/name[@revision]); mount the model (e.g. -v /path/to/model:/models/name:ro), name it by "
            "Hub ID, or use a preset"
        ]
    if not (folder / "config.json").is_file():
        return [f"TRAIN_MODEL={s.model}: the folder has no config.json; point it at a Hugging Face model folder"]
    if not _readable(folder / "config.json"):
        return [f"TRAIN_MODEL={s.model}: cannot read config.json; check the file's permissions"]
    return []


def _rope_problems(s: TrainSettings) -> list[str]:
    """TRAIN_ROPE_*, and a TRAIN_SEQ_LEN beyond the model's positions; a Hub model's config is checked by the run."""
    return rope_problems(s, readable_model_config(s))


def _tokenizer_problems(s: TrainSettings) -> list[str]:
    if not s.tokenizer or hub_ref(s.tokenizer) is not None:
        return []
    folder = Path(s.tokenizer)
    if not folder.is_dir():
        return [f"TRAIN_TOKENIZER={s.tokenizer!r} is neither an existing folder nor a Hub ID (org/name[@revision])"]
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return [f"TRAIN_TOKENIZER={s.tokenizer}: the folder has none of {', '.join(TOKENIZER_FILES)}"]
    return []


def _eval_problems(s: TrainSettings) -> list[str]:
    has_eval = bool(s.eval_data) or s.eval_split > 0
    problems = []
    if s.eval_data and s.eval_split > 0:
        problems.append(f"TRAIN_EVAL_DATA and TRAIN_EVAL_SPLIT={s.eval_split} both choose evaluation data; set one")
    if not has_eval and (s.eval_steps or s.keep_best):
        what = "TRAIN_KEEP_BEST=1" if s.keep_best else f"TRAIN_EVAL_STEPS={s.eval_steps}"
        problems.append(f"{what} needs evaluation data: set TRAIN_EVAL_DATA or TRAIN_EVAL_SPLIT (e.g. 0.05)")
    if s.eval_generate and not s.eval_data:
        problems.append(f"TRAIN_EVAL_GENERATE={s.eval_generate} answers prompts of TRAIN_EVAL_DATA (prompt/completion "
                        "records or conversations); set TRAIN_EVAL_DATA, or TRAIN_EVAL_GENERATE=0")  # fmt: skip
    if s.eval_generate and methods.method_of(s).family != "sft":
        problems.append(f"TRAIN_EVAL_GENERATE={s.eval_generate} works with TRAIN_METHOD=sft only; set it to 0")
    if s.eval_generate and (s.fsdp != "none" or s.zero_stage == 3):
        problems.append(f"TRAIN_EVAL_GENERATE={s.eval_generate} generates on the main process alone, which cannot "
                        "hold a model sharded by FSDP or ZeRO-3; set it to 0, or run `python -m trainer eval` on the "
                        "checkpoints")  # fmt: skip
    if s.keep_best and s.eval_steps and s.save_steps % s.eval_steps:
        problems.append(
            f"TRAIN_KEEP_BEST=1 keeps an evaluated checkpoint, so TRAIN_SAVE_STEPS={s.save_steps} must be a multiple "
            f"of TRAIN_EVAL_STEPS={s.eval_steps}; e.g. TRAIN_EVAL_STEPS=0 (evaluate at every save)"
        )
    return problems


def _hub_problems(inputs: Inputs) -> list[str]:
    """Resolves (and downloads, unless HF_HUB_OFFLINE=1) the Hub IDs; run only when everything else is right. A Hub
    dataset's files are checked here, once fetched."""
    found = inputs.hub.problems_of
    problems = [*found.get("model", ()), *found.get("tokenizer", ())]
    if inputs.on_hub("data"):
        problems += inputs.data.problems
    if inputs.on_hub("eval_data"):
        problems += inputs.eval_data.problems
    return problems


def writable_dir_problem(name: str, path: str) -> str | None:
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
    problem = writable_dir_problem("TRAIN_OUTPUT_DIR", s.output_dir)
    return [problem] if problem else []


def _nvme_problems(s: TrainSettings) -> list[str]:
    if s.zero_offload != "nvme":
        return []
    if not Path(s.nvme_path).is_dir():
        return [f"TRAIN_NVME_PATH={s.nvme_path}: no such folder; mount a folder on a fast local NVMe disk there"]
    problem = writable_dir_problem("TRAIN_NVME_PATH", s.nvme_path)
    return [problem] if problem else []


def _readable(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            handle.read(1)
    except OSError:
        return False
    return True


# ---- data (discovery and its checks live in trainer.data.discovery; one scan per run, kept by Inputs) -------------


def _data_problems(inputs: Inputs) -> list[str]:
    if inputs.on_hub("data"):
        return list(inputs.mix.problems)  # a Hub dataset is scanned after it is fetched (_hub_problems)
    return list(inputs.data.problems)


def _mix_problems(s: TrainSettings) -> list[str]:
    """A mix of sources is for SFT and online RL's prompts, several eval sets for SFT (trainer.data.mix);
    preference data is read whole."""
    family = methods.method_of(s).family
    mixes = parse_mix(s.data).is_mix and family != "online"
    lists = [name for name, value in (("TRAIN_DATA", mixes),
                                      ("TRAIN_EVAL_DATA", bool(parse_eval_sets(s.eval_data)))) if value]  # fmt: skip
    if family == "sft" or not lists:
        return []
    return [f"{' and '.join(lists)}: several sources (a mix, named eval sets) are for TRAIN_METHOD=sft (a "
            f"TRAIN_DATA mix also for {'/'.join(names('online'))}); TRAIN_METHOD={s.method} reads one source: give "
            "one path, folder or glob"]  # fmt: skip


def _eval_data_problems(inputs: Inputs) -> list[str]:
    eval_data = inputs.settings.eval_data
    if inputs.on_hub("eval_data"):
        return eval_set_problems(eval_data)  # a Hub dataset is scanned after it is fetched (_hub_problems)
    return list(inputs.eval_data.problems) if eval_data else []


RESUME_WORDS = ("auto", "never")  # TRAIN_RESUME's words; anything else is a checkpoint folder


def resume_problems(s: TrainSettings) -> list[str]:
    """What is wrong with TRAIN_RESUME, known without reading the checkpoint (trainer.config.resume reads it)."""
    if s.resume in RESUME_WORDS or Path(s.resume).is_dir():
        return []
    return [f"TRAIN_RESUME={s.resume!r}: no such checkpoint folder; use auto, never or an existing checkpoint-N path"]


def _on_settings(check: Callable[[TrainSettings], list[str]]) -> Callable[[Inputs], list[str]]:
    return lambda inputs: check(inputs.settings)


SETTINGS_CHECKS: tuple[Callable[[TrainSettings], list[str]], ...] = (
    _combination_problems, compat.unsupported_problems, _library_problems, _optimizer_problems,
    _deepspeed_config_problems, _train_args_problems, _model_problems, _rope_problems, _tokenizer_problems,
    resume_problems, _nvme_problems, _output_problems,
)  # fmt: skip
STATIC_CHECKS: tuple[Callable[[Inputs], list[str]], ...] = (
    *map(_on_settings, SETTINGS_CHECKS),
    _data_problems,
    _on_settings(methods.option_problems),
    methods.data_problems,
    _on_settings(push_problems),
    _on_settings(_eval_problems),
    _on_settings(_mix_problems),
    _eval_data_problems,
)  # fmt: skip


def static_problems(inputs: Inputs) -> list[str]:
    """Every problem that can be found without torch, in a stable order; the Hub is asked only when there is none.
    The Hub snapshots and data scans are kept on `inputs`, for `resolve` and the run."""
    problems = [problem for check in STATIC_CHECKS for problem in check(inputs)]
    return problems or _hub_problems(inputs) or _chat_template_problems(inputs)


def _chat_template_problems(inputs: Inputs) -> list[str]:
    """After the Hub: the template comes with a Hub tokenizer; a Hub dataset's pairs are read once fetched."""
    found = methods.data_problems(inputs, hub=True) or [p for p in [methods.template_problem(inputs)] if p]
    return found or template_problems(inputs.data, inputs.settings.chat_template, inputs.tokenizer_folder)
