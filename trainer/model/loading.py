"""`load(what, how)`: every model trainkit builds or loads, for the run (policy and reward model), generate, eval
and export.

`what` (Weights) is a preset (fresh weights), a model folder (local, a Hub snapshot, a full checkpoint, final/, an
export), a folder's architecture with fresh weights (consolidated shards are loaded into it), or a folder plus a
saved LoRA adapter (a LoRA checkpoint, final/adapter/, --adapter). `how` (LoadHow) is the dtype, bitsandbytes
quantization, placement, attention implementation, a one-score head (reward models), RoPE scaling and a mixture of
experts' experts implementation; an MXFP4 checkpoint (gpt-oss) is dequantized where `how` asks for dense experts or
the kernels are absent, and the log says so. Nothing is read from the network: a Hub model is a snapshot folder
already (trainer.hub).
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.model.quantization import QUANTS

if TYPE_CHECKING:
    from trainer.config.schema import TrainSettings

log = logging.getLogger("trainer")


@dataclass(frozen=True)
class Weights:
    """What to load: exactly one of `preset` and `folder`."""

    folder: str | None = None  # a model folder: local, a Hub snapshot, a full checkpoint, final/, an export
    preset: str | None = None  # a preset's name: fresh weights, its vocabulary and special ids from `tokenizer`
    adapter: Path | None = None  # a saved LoRA adapter attached to the folder's model
    tokenizer: Any = None  # the model's tokenizer: a loaded folder's embeddings are fitted to it (as the run did)
    fresh: bool = False  # the folder's architecture (its config.json) with fresh weights

    def __post_init__(self) -> None:
        if (self.folder is None) == (self.preset is None):
            raise ValueError("Weights: give exactly one of folder and preset")
        if self.preset is not None and self.tokenizer is None:
            raise ValueError("Weights: a preset takes its vocabulary from a tokenizer")


@dataclass(frozen=True)
class LoadHow:
    """How to load it. Dtypes are named as trainer.config.precision names them (float32, bfloat16, float16)."""

    dtype: str | None = "float32"  # the weights' dtype; "auto": as saved; None: Transformers' own default
    quant: str = "none"  # bitsandbytes: none, 8bit, 4bit
    quant_type: str = "nf4"  # 4bit's data type (nf4, fp4)
    double_quant: bool = False  # 4bit: quantize the quantization constants too
    compute: str | None = None  # 4bit's compute dtype; None: bf16 where native, else fp16 (trainer.model.quantization)
    shardable: bool = False  # 4bit weights stored in the compute dtype, for FSDP to shard
    unquantized: tuple[str, ...] = ()  # module name patterns bitsandbytes leaves whole (a projector), the LM head too
    device: str | int | None = None  # where the weights go (a device map of one device); None: where Transformers
    # puts them (the CPU) or, under FSDP, where FSDP places them
    attention: str | None = None  # attn_implementation as Transformers takes it; None: its default
    score_head: bool = False  # a one-score head instead of the LM head (a reward model)
    rope: TrainSettings | None = None  # TRAIN_ROPE_* checked and written into the config (the run's own settings)
    recorded_rope: TrainSettings | None = None  # the scaling a run recorded, for a base that carries none
    experts: str | None = None  # a mixture of experts' experts_implementation (trainer.model.moe); None: Transformers'
    dense_experts: bool = False  # MXFP4 experts (gpt-oss) dequantized even where the kernels run: training needs them

    def __post_init__(self) -> None:
        if self.quant not in QUANTS:
            raise ValueError(f"LoadHow.quant={self.quant!r}: one of {', '.join(QUANTS)}")


def load(what: Weights, how: LoadHow) -> Any:
    """The model `what` names, loaded as `how` says (in training mode: callers that only read it call .eval())."""
    config = model_config(what, how)
    if what.preset is not None or what.fresh:
        model = _fresh(config, how)
    else:
        kwargs = {**pretrained_kwargs(how), **mxfp4_kwargs(config, how)}
        model = _model_class(how, config).from_pretrained(what.folder, config=config, **kwargs)
        say_dequantized(config, model)
        if what.tokenizer is not None:
            from trainer.tokenizer import fit_embeddings

            fit_embeddings(model, what.tokenizer)  # as the run did before training (and before adding its adapter)
    if what.adapter is not None:
        from trainer.model.adapters import attach_adapter

        model = attach_adapter(model, what.adapter)
    log.info("model loaded: %s", described(what, how, model))
    return model


def described(what: Weights, how: LoadHow, model: Any) -> str:
    """One line naming what was loaded and how: the same words from the run, generate, eval and export."""
    source = f"preset {what.preset!r} (fresh weights)" if what.preset else f"{what.folder}" + (
        " (its architecture, fresh weights)" if what.fresh else "")  # fmt: skip
    head = "one-score head" if how.score_head else "LM head"
    adapter = f" + LoRA adapter {what.adapter}" if what.adapter is not None else ""
    quant = f", {how.quant} quantized" if how.quant != "none" else ""
    base = model.get_base_model() if what.adapter is not None else model
    from trainer.config.moe import moe_of
    from trainer.model.moe import experts_implementation

    moe = moe_of(base.config)
    experts = f", {moe.describe()} run by {experts_implementation(base) or 'one module each'}" if moe else ""
    return f"{source}{adapter}: {type(base).__name__} ({head}), {model.dtype} weights{quant}{experts} on {model.device}"


def model_config(what: Weights, how: LoadHow) -> Any:
    """The config the model is built with: the preset's or the folder's, with the head and the RoPE scaling."""
    from trainer.config.rope import existing_scaling, scale_rope

    if what.preset is not None:
        from trainer.config.presets import is_vision_preset
        from trainer.model.build import preset_config
        from trainer.model.vision_preset import vision_preset_config

        config = (vision_preset_config(what.preset, what.tokenizer) if is_vision_preset(what.preset)
                  else preset_config(what.preset, len(what.tokenizer), 0, what.tokenizer))  # fmt: skip
    else:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(what.folder, local_files_only=True)
    if how.score_head:
        config.num_labels = 1
    if how.rope is not None:
        config = scale_rope(config, how.rope)
    if how.recorded_rope is not None and existing_scaling(config.to_dict()) is None:
        config = scale_rope(config, how.recorded_rope)
    return config


def _model_class(how: LoadHow, config: Any = None) -> Any:
    """A one-score head's class, a vision-language model's (trainer.model.vision), else the causal LM's."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from trainer.model.vision import model_class

    if how.score_head:
        return AutoModelForSequenceClassification
    return model_class(config) or AutoModelForCausalLM


def _dtype(name: str) -> Any:
    import torch

    return name if name == "auto" else getattr(torch, name)


def pretrained_kwargs(how: LoadHow) -> dict[str, Any]:
    """from_pretrained's arguments for `how` (offline: a Hub model is a snapshot folder already)."""
    from trainer.compat import model_dtype_kwargs

    kwargs: dict[str, Any] = {"local_files_only": True}
    if how.attention is not None:
        kwargs["attn_implementation"] = how.attention
    if how.dtype is not None:
        kwargs.update(model_dtype_kwargs(_dtype(how.dtype)))
    if how.quant != "none":
        from trainer.model.quantization import bnb_config

        kwargs["quantization_config"] = bnb_config(how.quant, how.quant_type, how.double_quant, how.compute,
                                                   how.shardable, how.unquantized)  # fmt: skip
    if how.device is not None:
        kwargs["device_map"] = {"": how.device}
    if how.experts is not None:
        kwargs["experts_implementation"] = how.experts
    return kwargs


def _mxfp4(config: Any) -> bool:
    quant = getattr(config, "quantization_config", None)
    method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)
    return str(getattr(method, "value", method)) == "mxfp4"


def mxfp4_kwargs(config: Any, how: LoadHow) -> dict[str, Any]:
    """An MXFP4 checkpoint (gpt-oss's experts) dequantized where `how` asks for dense experts; else Transformers
    decides (it dequantizes where its MXFP4 kernels, triton and the kernels package, are absent)."""
    if not _mxfp4(config):
        return {}
    if how.quant != "none":
        from trainer.errors import ConfigError

        raise ConfigError(f"TRAIN_QUANT={how.quant}: the model is MXFP4-quantized (its experts: gpt-oss's own "
                          "format), and bitsandbytes cannot quantize it again; set TRAIN_QUANT=none (its experts "
                          "are dequantized for training)")  # fmt: skip
    if not how.dense_experts:
        return {}
    from transformers import Mxfp4Config

    return {"quantization_config": Mxfp4Config(dequantize=True)}


def say_dequantized(config: Any, model: Any) -> None:
    if not _mxfp4(config):
        return
    experts = [m for m in model.modules() if type(m).__name__.endswith("Experts")]
    if experts and not type(experts[0]).__name__.startswith("Mxfp4"):
        log.info("model: its MXFP4 expert weights were dequantized to %s at load (training needs dense weights, and "
                 "Transformers dequantizes where its MXFP4 kernels, triton and the kernels package, are absent)",
                 str(model.dtype).removeprefix("torch."))  # fmt: skip
    else:
        log.info("model: its experts stay MXFP4 (Transformers' MXFP4 kernels)")


def _fresh(config: Any, how: LoadHow) -> Any:
    """Fresh weights, made in fp32 (the master weights) on `how.device`; bitsandbytes quantizes at load time, so a
    quantized one is saved once and loaded back."""
    import torch

    from trainer.compat import model_dtype_kwargs

    fp32 = model_dtype_kwargs(torch.float32)
    cls = _model_class(how, config)
    if how.quant != "none":
        made = cls.from_config(config, **fp32)
        with tempfile.TemporaryDirectory(prefix="trainkit-preset-") as tmp:
            made.save_pretrained(tmp)
            del made
            return cls.from_pretrained(tmp, **pretrained_kwargs(how))
    attention = {} if how.attention is None else {"attn_implementation": how.attention}
    experts = {} if how.experts is None else {"experts_implementation": how.experts}
    with torch.device(how.device if how.device is not None else "cpu"):
        model = cls.from_config(config, **attention, **experts, **fp32)
    if how.dtype not in (None, "auto", "float32"):
        model = model.to(_dtype(how.dtype))
    return model
