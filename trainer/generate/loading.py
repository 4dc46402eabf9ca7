"""MODEL -> a model and its tokenizer, ready to generate: the one loader of `generate` and `eval`.

MODEL is a run folder (its final/, else its newest complete checkpoint), final/, an export, a checkpoint (a LoRA
checkpoint loads the base its run recorded, plus the adapter), a base with `--adapter FOLDER`, a preset (fresh
random weights, the byte-level tokenizer) or a Hub ID (org/name[@revision], from HF_HOME's cache when offline).
The tokenizer, and with it the chat template the run trained with, is the one saved with the model. Every mistake
is a ConfigError (exit 2) raised before any weights are read; `--quant` is refused where bitsandbytes cannot run it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.checkpoint_record import holds_full_model
from trainer.config.precision import DTYPE_NAMES
from trainer.errors import ConfigError

if TYPE_CHECKING:
    from trainer.config.run_record import RunRecord
    from trainer.model.loading import LoadHow

log = logging.getLogger("trainer")
DTYPES = {"auto": None, **DTYPE_NAMES}  # --dtype: auto keeps the saved dtype (a LoRA checkpoint: the run's)
GENERATE_FIX = "give the base as MODEL and the adapter with --adapter FOLDER"


@dataclass(frozen=True)
class Choice:
    """How the model is loaded (the command line's --dtype, --quant, --quant-type, --double-quant)."""

    dtype: str = "auto"
    quant: str = "none"
    quant_type: str = "nf4"
    double_quant: bool = False


@dataclass
class Plan:
    """What MODEL names, found from file names and JSON only (no weights read yet)."""

    model: str  # a folder, a Hub snapshot folder or a preset name
    adapter: Path | None
    tokenizer_folders: tuple[Path, ...]
    described: str
    preset: bool = False
    run_dir: Path | None = None  # the training run it came from, when known
    run: RunRecord | None = None  # its record (trainer.config.run_record), when it came from a run
    folder: Path | None = None  # the run's folder read (final/ or checkpoint-N), when it came from a run
    step: int | None = None  # its step
    base_dtype: str | None = None  # a LoRA checkpoint's base: the dtype the run read it in (its compute dtype)
    recorded_rope: Any = None  # a LoRA checkpoint's base: the RoPE scaling the run trained it with


@dataclass
class Loaded:
    model: Any
    tokenizer: Any
    plan: Plan
    device: Any
    processor: Any = None  # a vision-language model's (its tokenizer is `tokenizer`): prompts with images

    @property
    def chat_template(self) -> str | None:
        template = getattr(self.tokenizer, "chat_template", None)
        if isinstance(template, dict):
            template = template.get("default") or next(iter(template.values()), None)
        return template or None


def plan_of(model: str, adapter: str | None, command: str) -> Plan:
    """MODEL (+ --adapter) -> Plan; ConfigError naming what is wrong and how to fix it."""
    from trainer.config.presets import is_preset

    if adapter is not None:
        return _with_adapter(model, Path(adapter), command)
    if Path(model).is_dir():
        return _from_folder(Path(model), command)
    if is_preset(model):
        return Plan(model, None, (), f"preset {model!r} (random weights)", preset=True)
    return _from_hub(model, command)


def _from_hub(model: str, command: str) -> Plan:
    folder = _hub_folder(model, command)
    return Plan(folder, None, (Path(folder),), f"{model} ({folder})")


def _hub_folder(model: str, command: str) -> str:
    from trainer.config.presets import MODEL_PRESETS
    from trainer.hub.download import snapshot
    from trainer.hub.ids import parse_model_id

    ref = parse_model_id(model)
    if ref is None or model.startswith((".", "/")):
        raise ConfigError(f"{command} {model}: no such folder, not a preset ({', '.join(MODEL_PRESETS)}) and not a "
                          "Hub ID org/name[@revision]")  # fmt: skip
    return str(snapshot(ref, f"{command} MODEL").path)


def _from_folder(folder: Path, command: str) -> Plan:
    from trainer.export import merge
    from trainer.export.source import ADAPTER, FULL, resolve_source

    source = resolve_source(folder, command=command)  # a damaged folder is refused there, naming the file
    if source.kind == ADAPTER:
        base, how = merge.base_folder(source, None, command=command, fix=GENERATE_FIX)
        folders = (source.folder, *([source.adapter] if source.adapter else []), Path(base))
        return Plan(base, source.adapter, folders, f"{source.folder} (LoRA adapter on {how})", run_dir=source.run_dir,
                    run=source.run, folder=source.folder, step=source.step,
                    base_dtype=merge.run_dtype_name(source),
                    recorded_rope=merge.recorded_scaling(source.run))  # fmt: skip
    if source.kind != FULL:
        raise ConfigError(f"{command} {folder}: {source.folder} holds {source.kind.upper()} shards; turn them into a "
                          f"model folder first: python -m trainer export {folder} OUT, then {command} OUT")  # fmt: skip
    return Plan(str(source.folder), None, (source.folder,), str(source.folder), run_dir=source.run_dir,
                run=source.run, folder=source.folder, step=source.step)  # fmt: skip


def _with_adapter(model: str, adapter: Path, command: str) -> Plan:
    from trainer.config.presets import is_preset

    if not (adapter / "adapter_config.json").is_file():
        nested = adapter / "adapter"
        if not (nested / "adapter_config.json").is_file():
            raise ConfigError(f"{command} --adapter {adapter}: no adapter_config.json there; give a LoRA checkpoint, "
                              "final/adapter/ or an --adapter-only export")  # fmt: skip
        adapter = nested
    if is_preset(model):
        raise ConfigError(f"{command} {model} --adapter {adapter}: a preset's base weights are random and saved "
                          "nowhere; give the run's final/ (the adapter merged) instead")  # fmt: skip
    base = model if Path(model).is_dir() else _hub_folder(model, command)
    if Path(model).is_dir() and not holds_full_model(Path(model)):
        raise ConfigError(f"{command} {model}: no model weights in it (config.json and *.safetensors or *.bin); "
                          "give the base model folder")  # fmt: skip
    return Plan(base, adapter, (adapter, Path(base)), f"{model} + LoRA adapter {adapter}")


def quant_problem(choice: Choice, on_gpu: bool) -> str | None:
    """Why bitsandbytes cannot run `--quant` on this machine (read from the installed versions), or None."""
    from trainer.compat import bitsandbytes_quantizes_on_cpu, installed_version

    if choice.quant == "none":
        return None
    version = installed_version("bitsandbytes")
    if version is None:
        return f"--quant {choice.quant} needs bitsandbytes: pip install bitsandbytes (it is in the GPU images)"
    if not on_gpu and not bitsandbytes_quantizes_on_cpu():
        return (f"--quant {choice.quant} on a machine without a GPU needs bitsandbytes 0.46+ (its CPU backend); "
                f"{version} is installed: run on a GPU, or leave --quant out")  # fmt: skip
    return None


def load(model: str, adapter: str | None, choice: Choice, command: str = "generate") -> Loaded:
    """Plan, check, then load: the model in eval mode on this machine's GPU (else the CPU) and its tokenizer."""
    plan = plan_of(model, adapter, command)
    import torch

    on_gpu = torch.cuda.is_available()
    problem = quant_problem(choice, on_gpu)
    if problem:
        raise ConfigError(problem)
    if choice.quant != "none" and plan.preset:
        raise ConfigError(f"{command} {model} --quant: a preset is built from scratch; quantize a trained model")
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    processor = _processor(plan)
    tokenizer = processor.tokenizer if processor is not None else _tokenizer(plan)
    built = _build(plan, choice, tokenizer, device)
    built.eval()
    log.info("%s: %s loaded (%s, %s on %s)", command, plan.described, _precision(built, choice), built.dtype, device)
    return Loaded(built, tokenizer, plan, device, processor)


def _precision(model: Any, choice: Choice) -> str:
    if choice.quant == "4bit":
        return f"4-bit {choice.quant_type}" + (" double-quantized" if choice.double_quant else "")
    return "8-bit" if choice.quant == "8bit" else "not quantized"


def _processor(plan: Plan) -> Any:
    """A vision-language model's processor (saved beside its weights, or a vision preset's); None for others."""
    from trainer.config.presets import is_vision_preset
    from trainer.data.vision import folder_reads_images
    from trainer.model.vision import PROCESSOR_FILES, load_processor
    from trainer.model.vision_preset import qwen2_vl_processor

    if plan.preset:
        return qwen2_vl_processor(_tokenizer(plan), plan.model) if is_vision_preset(plan.model) else None
    if not folder_reads_images(plan.model):
        return None
    folders = [*plan.tokenizer_folders, Path(plan.model)]
    saved = next((f for f in folders if any((Path(f) / name).is_file() for name in PROCESSOR_FILES)), plan.model)
    return load_processor(saved)


def _tokenizer(plan: Plan) -> Any:
    from trainer.tokenizer import has_tokenizer, load_tokenizer

    for folder in plan.tokenizer_folders:
        if has_tokenizer(folder):
            return load_tokenizer(str(folder))
    return load_tokenizer(plan.model)  # a preset, or a folder without one: the byte-level tokenizer


def load_how(plan: Plan, choice: Choice, device: Any) -> LoadHow:
    """How MODEL loads as --dtype/--quant say: auto keeps the saved dtype (a LoRA checkpoint's base: the dtype its run
    read it in); --quant 4bit computes in --dtype, else bf16 where the GPU runs it natively, else fp16."""
    from trainer.model.loading import LoadHow

    dtype = DTYPES[choice.dtype] or ("float32" if plan.preset else plan.base_dtype or "auto")
    place = (device.index or 0) if device.type == "cuda" else ("cpu" if choice.quant != "none" else None)
    return LoadHow(dtype=dtype, quant=choice.quant, quant_type=choice.quant_type, double_quant=choice.double_quant,
                   compute=DTYPES[choice.dtype], device=place, recorded_rope=plan.recorded_rope)  # fmt: skip


def _build(plan: Plan, choice: Choice, tokenizer: Any, device: Any) -> Any:
    """The model through trainer.model: a preset's fresh weights, or the folder (+ adapter)."""
    from trainer.model.loading import Weights, load

    if not plan.preset and not holds_full_model(Path(plan.model)):
        raise ConfigError(f"{plan.model}: no model weights in it (config.json and *.safetensors or *.bin)")
    how = load_how(plan, choice, device)
    if plan.preset:
        seed_as_a_run_does()
        return load(Weights(preset=plan.model, tokenizer=tokenizer), how)
    _check_headers(Path(plan.model))
    fitted = tokenizer if plan.adapter is not None else None  # an adapter's base is fitted as the run fitted it
    return load(Weights(folder=plan.model, adapter=plan.adapter, tokenizer=fitted), how)


def seed_as_a_run_does() -> None:
    """A preset's fresh weights are the ones a run with TRAIN_SEED's default starts from, the same every time: `eval`
    or `generate` of a preset (a baseline against a trained model) gives the same figures on every call, not a new
    draw each time (a draw of the tiny preset scored a pairs file anywhere from 0.65 to 1.0)."""
    from transformers import set_seed

    from trainer.config.schema import TrainSettings

    set_seed(TrainSettings.model_fields["seed"].default)


def _check_headers(folder: Path) -> None:
    """Each *.safetensors file's header covers the file (a truncated copy does not): a folder without a record
    (an export, a Hub snapshot) is checked this way before loading; ConfigError naming the file."""
    from safetensors import SafetensorError, safe_open

    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except (SafetensorError, OSError) as exc:
            raise ConfigError(f"{file} is damaged ({str(exc).splitlines()[0][:200]}); copy it again") from None


def memory_report(loaded: Loaded) -> str:
    """Weights' size and the peak memory of this process (GPU: allocated by torch; CPU: resident set)."""
    import torch

    from trainer.data.shards import peak_rss_bytes

    weights = loaded.model.get_memory_footprint() if hasattr(loaded.model, "get_memory_footprint") else 0
    if loaded.device.type == "cuda":
        peak = f"GPU peak {torch.cuda.max_memory_allocated(loaded.device) / 2**20:.0f} MiB"
    else:
        peak = f"process peak RSS {peak_rss_bytes() / 2**20:.0f} MiB"
    return f"memory: weights {weights / 2**20:.1f} MiB, {peak}"
