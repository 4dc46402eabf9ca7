"""The speed group's home (TRAIN_COMPILE*, TRAIN_ATTN, TRAIN_LIGER, TRAIN_CROSS_ENTROPY): the fast path's checks,
decisions and TrainingArguments: torch.compile, attention, Liger kernels, the cross-entropy (whole or chunked logits)
and host-device syncs.

Each `auto` here is on only where it pays on this machine, and its reason says why (or why not). What is chosen by
measurement is kept in the two tables below, filled from the bench on that GPU generation (docs/benchmarks.md);
a generation that is not in a table keeps the safe choice, and the reason says it has not been measured.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer import compat, transformers_names
from trainer.config.decision import Decision, Decisions, SoFar
from trainer.config.precision import computes_in_half
from trainer.config.presets import is_preset, language_preset, model_type_of
from trainer.config.schema import TrainSettings
from trainer.config.sharding import deepspeed_stage, uses_deepspeed, uses_fsdp
from trainer.errors import ConfigError
from trainer.machine.hardware import module_available
from trainer.methods import of

if TYPE_CHECKING:
    from trainer.config.inputs import Inputs
    from trainer.machine.hardware import Hardware

# A run this short pays the compilation (tens of seconds to minutes) without earning it back.
COMPILE_MIN_STEPS = 200
# GPU generation -> the attention implementation measured fastest there (bench's attn rows). Empty until measured:
# auto keeps flash_attention_2 where installed, else sdpa.
MEASURED_ATTENTION: dict[str, str] = {}
# GPU generations where TRAIN_LIGER=1 measured faster than without it (bench's liger row). Empty until measured.
MEASURED_LIGER: frozenset[str] = frozenset()
GENERATIONS = ((10, "blackwell"), (9, "hopper"), (8, "ampere"), (7, "volta/turing"))


def gpu_generation(hw: Hardware) -> str | None:
    """hopper, ampere, ... of GPU 0 (None on CPU); Ada (8.9) counts as ampere, Blackwell (10.x, 12.x) as blackwell."""
    if not hw.is_gpu or hw.capability is None:
        return None
    major = hw.capability[0]
    return next((name for floor, name in GENERATIONS if major >= floor), "pre-volta")


def not_measured_with(s: TrainSettings) -> str:
    """Why a speed auto stays off (here and the batch search's, trainer/config/optim.py): DeepSpeed, FSDP or
    quantization, which it was not measured with ('' if none)."""
    if uses_deepspeed(s):
        return "DeepSpeed"
    if uses_fsdp(s):
        return f"TRAIN_FSDP={s.fsdp}"
    return f"TRAIN_QUANT={s.quant}" if s.quant != "none" else ""


# ---- torch.compile ------------------------------------------------------------------------------------------------


def _compile_auto_off(s: TrainSettings, hw: Hardware) -> str:
    """Why auto leaves torch.compile off here ('' when it turns it on)."""
    if not hw.is_gpu:
        return "no GPU: on CPU compiling takes longer than it saves in most runs"
    problem = compat.compile_default_problem()
    if problem:
        return problem
    if not hw.libraries.get("triton", False):
        return "inductor needs triton, which is not installed"
    if hw.capability is not None and hw.capability < (7, 0):
        return f"{hw.gpu_name}: triton needs compute capability 7.0+"
    other = not_measured_with(s)
    if other:
        return f"not measured with {other}"
    if 0 <= s.max_steps < COMPILE_MIN_STEPS:
        return f"a run of {s.max_steps} steps (< {COMPILE_MIN_STEPS}) does not earn back the compilation"
    return ""


def decide_compile(s: TrainSettings, hw: Hardware, check_backend: bool = True) -> Decision[bool]:
    if s.compile == "0":
        return Decision(False, "TRAIN_COMPILE=0")
    if s.compile == "auto":
        off = _compile_auto_off(s, hw)
        if off:
            return Decision(False, f"auto: off ({off})")
    if check_backend:
        _check_backend(s.compile_backend)
    if s.compile_backend == "inductor":
        if not hw.is_gpu and not hw.cxx_compiler:
            raise ConfigError(
                "TRAIN_COMPILE=1 on CPU: inductor needs a C++ compiler (g++), none found; set TRAIN_COMPILE=0"
            )
        if hw.is_gpu and not hw.libraries.get("triton", False):
            raise ConfigError("TRAIN_COMPILE=1 on GPU: inductor needs triton, which is not installed; TRAIN_COMPILE=0")
    how = f"backend {s.compile_backend}, mode {s.compile_mode}, {compile_layout(s, os.environ)}"
    if s.compile == "auto":
        steps = "epochs" if s.max_steps < 0 else f"{s.max_steps} steps"
        return Decision(True, f"auto: a GPU run ({steps}) on {compat.stack().describe()}: inductor fuses the "
                              f"elementwise work ({how}); the compile time is logged apart")  # fmt: skip
    note = "; CUDA graphs are skipped on CPU, so reduce-overhead behaves like default" if (
        s.compile_mode == "reduce-overhead" and not hw.is_gpu) else ""  # fmt: skip
    return Decision(True, f"set by TRAIN_COMPILE ({how}){note}")


REGIONAL_ENV = "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"  # read by Accelerate's TorchDynamoPlugin
CACHE_ENV = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}


def compiled_by_accelerate(s: TrainSettings) -> bool:
    """Who compiles: with DeepSpeed or FSDP, Transformers' torch_compile (Accelerate compiles each repeated block
    after wrapping the model, its regional compilation); otherwise the trainer compiles each decoder layer in place
    (trainer.run.training_model.compile_layers) before the batch search, so the search sizes the model that trains."""
    return uses_deepspeed(s) or uses_fsdp(s)


def compile_environment(environ: Mapping[str, str], scope: str) -> dict[str, str]:
    """What a compiled run sets before torch compiles anything: Accelerate's regional compilation (used with
    DeepSpeed and FSDP) as TRAIN_COMPILE_SCOPE says, and the inductor and triton caches (the user's folders win) on
    the cache volume next to HF_HOME (the images set /cache/inductor and /cache/triton; a run from source gets
    HF_HOME/../torch-compile/), so a restarted run and every later run with the same model, shapes and versions
    reuse the compiled kernels (the output folder would serve only its own run)."""
    env = {REGIONAL_ENV: "1" if scope == "layers" else "0"}
    xdg_cache = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    caches = Path(environ.get("HF_HOME") or Path(xdg_cache) / "huggingface").parent / "torch-compile"
    chosen = without_torchs_default(environ)
    for name, folder in CACHE_ENV.items():
        env[name] = chosen.get(name) or str(caches / folder)
    return env


def without_torchs_default(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` less a TORCHINDUCTOR_CACHE_DIR that is torch's own default (/tmp/torchinductor_USER): torch writes it
    into os.environ whenever something touches inductor, importing Transformers' TrainingArguments included, so in a
    run it is no user's choice and not where the caches are kept."""
    value = environ.get("TORCHINDUCTOR_CACHE_DIR")
    torchs = value is not None and Path(value).parent == Path(tempfile.gettempdir()) and (
        Path(value).name.startswith("torchinductor_"))  # fmt: skip
    return {name: v for name, v in environ.items() if not (torchs and name == "TORCHINDUCTOR_CACHE_DIR")}


def compile_layout(s: TrainSettings, environ: Mapping[str, str]) -> str:
    """How a compiled run compiles and where its caches are, for the decision's reason."""
    env = compile_environment(environ, s.compile_scope)
    if compiled_by_accelerate(s):
        how = ("by Accelerate, regional (each repeated block)" if s.compile_scope == "layers"
               else "by Accelerate, the whole model")  # fmt: skip
    elif s.compile_scope == "layers":
        how = ("TRAIN_COMPILE_SCOPE=layers, regional: each decoder layer compiled in place, one compile reused by "
               "every layer; the loss, the mask and the records hook stay eager")  # fmt: skip
    else:
        how = "TRAIN_COMPILE_SCOPE=model: the whole model's forward compiled, embeddings, mask and LM head included"
    caches = ", ".join(f"{name}={env[name]}" for name in CACHE_ENV)
    return f"{how}; caches {caches}; a partial last batch is left out of each epoch (counted at start)"


# torch.compile backends that compile a forward only (no backward: they cannot train the model), and the package
# each of the others needs beyond torch; a name torch does not know is refused by _check_backend once torch loads.
INFERENCE_ONLY_BACKENDS = frozenset({"tvm", "tensorrt", "torch_tensorrt", "openxla_eval"})
BACKEND_PACKAGES = {"onnxrt": "onnxruntime", "openxla": "torch_xla", "ipex": "intel_extension_for_pytorch"}


def backend_problem(s: TrainSettings, available: Callable[[str], bool]) -> str | None:
    """Why TRAIN_COMPILE_BACKEND cannot train the model here (None when it can, or when nothing compiles)."""
    backend = s.compile_backend
    if s.compile == "0":
        return None
    if backend in INFERENCE_ONLY_BACKENDS:
        return (f"TRAIN_COMPILE_BACKEND={backend} compiles the forward pass only (inference): it cannot train the "
                "model; use inductor (the default) or TRAIN_COMPILE=0")  # fmt: skip
    package = BACKEND_PACKAGES.get(backend)
    if package and not available(package):
        return (f"TRAIN_COMPILE_BACKEND={backend} needs the {package} package, which is not installed; use inductor "
                "(the default) or TRAIN_COMPILE=0")  # fmt: skip
    return None


def _check_backend(backend: str) -> None:
    import torch._dynamo

    if backend not in torch._dynamo.list_backends(exclude_tags=()):
        usual = torch._dynamo.list_backends()  # without debug/experimental ones
        raise ConfigError(
            f"TRAIN_COMPILE_BACKEND={backend!r} is not a torch.compile backend"
            f"{transformers_names.did_you_mean(backend, usual)}; usual ones: {', '.join(usual)}"
        )


# ---- attention ----------------------------------------------------------------------------------------------------


def _flash_problem(attn: str, hw: Hardware, precision: str) -> str | None:
    """Why TRAIN_ATTN=flash_attention_2/4 cannot run here, or None."""
    if attn == "flash_attention_4":
        if not hw.libraries.get("flash_attn_4", False):
            return ("TRAIN_ATTN=flash_attention_4 needs the flash-attn-4 package, which is not installed; use "
                    "TRAIN_ATTN=sdpa (or auto), or `pip install flash-attn-4`")  # fmt: skip
        if hw.capability is None or hw.capability < (9, 0):
            return f"TRAIN_ATTN=flash_attention_4 needs a Hopper or newer GPU; this is {hw.describe()}; use sdpa"
    else:
        if not (hw.libraries.get("flash_attn", False) and compat.flash_attention_2_possible()):
            return ("TRAIN_ATTN=flash_attention_2 needs the flash_attn package, which is not installed; "
                    "use TRAIN_ATTN=sdpa (or auto), or an image built with flash-attn")  # fmt: skip
        if not hw.ampere_or_newer:
            return f"TRAIN_ATTN=flash_attention_2 needs an Ampere or newer GPU; this is {hw.describe()}; use sdpa"
    if not computes_in_half(precision):
        return f"TRAIN_ATTN={attn} works in fp16/bf16 only; set TRAIN_PRECISION=bf16 or use sdpa"
    return None


def records_apart(attn: str) -> str:
    """How a batch of packed records is kept apart with `attn` (trainer.model.packed_attention), for the reason."""
    if attn.startswith("flash_attention"):
        return ("packed records: one row per batch and their boundaries (cu_seq_lens, computed in the DataLoader) "
                "for the varlen kernel")  # fmt: skip
    if not compat.stack().packs_by_position_ids:
        return "packed records: a per-record additive 4D mask (this transformers finds no records in position ids)"
    if attn == "sdpa":
        return ("plain text gets no mask (SDPA's causal flash/cuDNN kernels); a batch of packed records one boolean "
                "block-diagonal mask built once for every layer: the fastest exact form on this path "
                "(SDPA's flash and cuDNN kernels take no mask; Transformers' own packed mask is the same mask but "
                "costs a host sync per forward, and its detection put a dense mask on plain text under compile; "
                "flex_attention's document masks, which skip the masked blocks, wait for a GPU measurement)")
    return "packed records: Transformers' per-record mask from the position ids"


def decide_attn(s: TrainSettings, hw: Hardware, precision: str) -> Decision:
    chosen = _choose_attn(s, hw, precision)
    return Decision(chosen.value, f"{chosen.reason}; {records_apart(chosen.value)}")


def _choose_attn(s: TrainSettings, hw: Hardware, precision: str) -> Decision:
    if s.attn in ("flash_attention_2", "flash_attention_4"):
        problem = _flash_problem(s.attn, hw, precision)
        if problem:
            raise ConfigError(problem)
    if s.attn != "auto":
        return Decision(s.attn, "set by TRAIN_ATTN")
    generation = gpu_generation(hw)
    measured = MEASURED_ATTENTION.get(generation or "")
    if measured and (measured == "sdpa" or _flash_problem(measured, hw, precision) is None):
        return Decision(measured, f"auto: measured fastest on {generation} GPUs (docs/benchmarks.md)")
    untested = f"; not measured on {generation} GPUs yet (docs/benchmarks.md)" if generation else ""
    if _flash_problem("flash_attention_2", hw, precision) is None:
        return Decision("flash_attention_2", f"auto: flash_attn is installed and the GPU is Ampere or newer{untested}")
    has_fa2 = hw.libraries.get("flash_attn", False) and compat.flash_attention_2_possible()
    why = "no flash-attn 2 on this stack" if not has_fa2 else "needs an Ampere+ GPU and fp16/bf16"
    return Decision("sdpa", f"auto: PyTorch scaled_dot_product_attention ({why}){untested}")


# ---- Liger kernels ------------------------------------------------------------------------------------------------


def liger_model_problem(model_folder: str) -> str | None:
    """Why Liger would leave the model as it is (Transformers only logs a warning for a model type Liger does not
    patch: a silent slow path), or None. Asks the installed Liger which model types it patches."""
    model_type = model_type_of(model_folder, model_folder) or ""
    try:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError:
        return None  # not importable: decide_liger refuses TRAIN_LIGER=1 for that already
    if model_type in MODEL_TYPE_TO_APPLY_LIGER_FN:
        return None
    return (f"TRAIN_LIGER=1: Liger has no kernels for this model's type {model_type!r} (it patches "
            f"{', '.join(sorted(MODEL_TYPE_TO_APPLY_LIGER_FN))}); set TRAIN_LIGER=0")


def decide_liger(s: TrainSettings, hw: Hardware, model_folder: str | None = None) -> Decision:
    installed = hw.libraries.get("liger_kernel", False)
    if s.liger == "0":
        return Decision(False, "TRAIN_LIGER=0")
    if s.liger == "1":
        if not installed:
            raise ConfigError("TRAIN_LIGER=1 needs the liger-kernel package, which the images do not ship (auto "
                              "never needs it: it is on only where measured faster); `pip install liger-kernel` "
                              "or TRAIN_LIGER=0")  # fmt: skip
        if not hw.is_gpu:
            raise ConfigError("TRAIN_LIGER=1 needs a CUDA GPU (Liger's kernels are triton kernels); set TRAIN_LIGER=0")
        problem = liger_model_problem(model_folder or s.model)
        if problem:
            raise ConfigError(problem)
        return Decision(True, "set by TRAIN_LIGER: Liger's fused RMSNorm, SwiGLU, RoPE and cross-entropy")
    generation = gpu_generation(hw)
    if generation is None:
        return Decision(False, "auto: off (no GPU)")
    if generation not in MEASURED_LIGER:
        return Decision(False, f"auto: off (not measured faster on {generation} GPUs yet; docs/benchmarks.md)")
    if not installed:
        return Decision(False, f"auto: off (measured faster on {generation} GPUs, but liger-kernel is not installed)")
    return Decision(True, f"auto: measured faster on {generation} GPUs (docs/benchmarks.md)")


# ---- the cross-entropy ----------------------------------------------------------------------------------------

# From this many vocabulary rows `auto` computes the loss in chunks (trainer.model.chunked_loss): the whole logits of a
# micro-batch ([positions, rows], upcast to fp32) then outweigh the model's other activations and decide the batch.
CHUNKED_MIN_VOCAB = 32_768
CHUNK_POSITIONS = 4096  # positions per chunk of the chunked loss: at 128k rows, one chunk's fp32 logits are 2 GiB
# Model types whose causal LM forward is exactly decoder -> lm_head -> Transformers' loss (no logit scaling or
# soft-capping, no auxiliary loss): the chunked loss computes what their forward computes.
CHUNKED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def vocab_rows(model_folder: str, tokenizer_folder: str | None = None) -> int | None:
    """The LM head's rows: a preset's own (else its tokenizer's, at least), a folder's config.json vocab_size; None
    when unknown (a byte-level preset: a few hundred rows)."""
    import json

    if is_preset(model_folder):
        rows = language_preset(model_folder).vocab or None
        if tokenizer_folder and tokenizer_folder != model_folder:
            rows = max(rows or 0, _tokenizer_rows(Path(tokenizer_folder)) or 0) or None
        return rows
    try:
        return int(json.loads((Path(model_folder) / "config.json").read_text(encoding="utf-8"))["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _tokenizer_rows(folder: Path) -> int | None:
    import json

    try:
        data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
        return len(data["model"]["vocab"]) + len(data.get("added_tokens") or [])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _chunked_problem(s: TrainSettings, liger: bool, model_type: str) -> str | None:
    """Why the chunked loss cannot stand in for this run's loss (None when it can)."""
    if of(s.method).needs_trl:
        return f"TRAIN_METHOD={s.method}: TRL computes its loss from the logits"
    if liger:
        return "Liger's fused linear cross-entropy computes the loss (TRAIN_LIGER)"
    if deepspeed_stage(s) == 3 or uses_fsdp(s):
        sharder = f"TRAIN_FSDP={s.fsdp}" if s.fsdp != "none" else "ZeRO-3"
        return f"{sharder} shards the LM head's weight, which it reads whole"
    if model_type not in CHUNKED_MODEL_TYPES:
        return (f"the model's type {model_type!r} is not one whose head it knows "
                f"({', '.join(sorted(CHUNKED_MODEL_TYPES))})")  # fmt: skip
    if s.lora and "lm_head" in s.lora_targets:
        return "TRAIN_LORA_TARGETS puts an adapter on the LM head"
    return None


def decide_cross_entropy(s: TrainSettings, liger: bool, model_folder: str,
                         tokenizer_folder: str | None = None) -> Decision[str]:  # fmt: skip
    """full (Transformers' loss on the whole logits) or chunked (trainer.model.chunked_loss)."""
    if s.cross_entropy == "full":
        return Decision("full", "set by TRAIN_CROSS_ENTROPY: Transformers' loss on the whole logits")
    model_type = model_type_of(model_folder, model_folder) or ""
    problem = _chunked_problem(s, liger, model_type)
    how = ("logits made a chunk of trained positions at a time and made again in the backward (one more LM-head "
           "matmul a step): the whole logits are never held")  # fmt: skip
    if s.cross_entropy == "chunked":
        if problem:
            raise ConfigError(f"TRAIN_CROSS_ENTROPY=chunked: {problem}; set TRAIN_CROSS_ENTROPY=full (or auto)")
        return Decision("chunked", f"set by TRAIN_CROSS_ENTROPY: {how}")
    if problem:
        return Decision("full", f"auto: full ({problem})")
    rows = vocab_rows(model_folder, tokenizer_folder)
    if rows is None or rows < CHUNKED_MIN_VOCAB:
        size = f"a {rows:,}-row vocabulary" if rows else "a small vocabulary"
        return Decision("full", f"auto: full ({size}: its logits weigh little next to the model's activations; "
                                f"chunked from {CHUNKED_MIN_VOCAB:,} rows)")  # fmt: skip
    return Decision("chunked", f"auto: chunked (a {rows:,}-row vocabulary, >= {CHUNKED_MIN_VOCAB:,}: a micro-batch's "
                               f"whole logits would decide the batch; {how}; its speed against the full loss is not "
                               "measured on a GPU yet, docs/benchmarks.md)")  # fmt: skip


# ---- host-device syncs --------------------------------------------------------------------------------------------


def decide_non_blocking(hw: Hardware, pin_memory: bool) -> Decision:
    if not hw.is_gpu:
        return Decision(False, "no GPU: batches stay in host memory")
    if not pin_memory:
        return Decision(False, "TRAIN_PIN_MEMORY=0: a copy from pageable memory cannot be asynchronous")
    return Decision(True, "pinned memory: each batch is copied to the GPU asynchronously (accelerate's non_blocking)")


def decide_nan_inf_filter(hw: Hardware) -> Decision:
    # Transformers' filter replaces a NaN/Inf step loss by the mean so far (0.0 right after a log): it would hide a
    # diverged run from the logged loss and from TRAIN_ON_NAN's guard (trainer.run.divergence), and costs a
    # synchronization per step on GPUs.
    return Decision(False, "off: a NaN/Inf loss stays in the logged loss (as null) and TRAIN_ON_NAN acts on it; "
                           "Transformers' filter would log it as the mean so far and, on GPUs, read each step's loss "
                           "on the host (a synchronization per step)")  # fmt: skip


# ---- the group's three functions (trainer/config/checks.py, decisions.py, training_arguments.py call them) ----------


def problems(inputs: Inputs) -> list[str]:
    s = inputs.settings
    found = [compat.switch_problem(f"TRAIN_ATTN={s.attn}"), backend_problem(s, module_available)]
    if s.compile == "1" and s.zero_stage == 3:
        found.append("TRAIN_COMPILE=1 with TRAIN_ZERO_STAGE=3: ZeRO-3 gathers parameters in hooks that break "
                     "torch.compile graphs; use TRAIN_ZERO_STAGE=2 or TRAIN_COMPILE=0")  # fmt: skip
    return [problem for problem in found if problem]


def decide(inputs: Inputs, hardware: Hardware, so_far: SoFar) -> dict[str, Decision]:
    s, model = inputs.settings, so_far["model"].value
    tokenizer = inputs.tokenizer_folder if s.tokenizer else None  # a preset's rows follow TRAIN_TOKENIZER's
    attn = so_far.attempt(decide_attn, s, hardware, so_far["precision"].value, fallback=Decision("sdpa", "refused"))
    compiled = so_far.attempt(decide_compile, s, hardware, so_far.import_heavy, fallback=Decision(False, "refused"))
    liger = so_far.attempt(decide_liger, s, hardware, model, fallback=Decision(False, "refused"))
    loss = so_far.attempt(decide_cross_entropy, s, liger.value, model, tokenizer, fallback=Decision("full", "refused"))
    return {
        "attn": attn,
        "compile": compiled,
        "liger": liger,
        "cross_entropy": loss,
        "non_blocking": decide_non_blocking(hardware, so_far["pin_memory"].value),
        "nan_inf_filter": decide_nan_inf_filter(hardware),
    }


def _compile_arguments(s: TrainSettings, decisions: Decisions) -> dict[str, Any]:
    # Transformers turns torch_compile on when a backend or mode is given, so pass them only when it compiles.
    if not decisions.compile.value:
        return {"torch_compile": False}
    # A partial last batch would recompile the model for its shape: a compiled run's training DataLoader drops it
    # (a different random one each epoch; trainer.run.train counts and records what is left out).
    if not compiled_by_accelerate(s):
        return {"torch_compile": False, "dataloader_drop_last": True}  # trainer.run.training_model compiles each layer
    return {"torch_compile": True, "torch_compile_backend": s.compile_backend, "torch_compile_mode": s.compile_mode,
            "dataloader_drop_last": True}  # fmt: skip


def arguments(settings: TrainSettings, decisions: Decisions, hardware: Hardware) -> dict[str, Any]:
    """torch.compile's arguments, Liger's kernels, and the host-device syncs a step need not make."""
    args: dict[str, Any] = {
        **_compile_arguments(settings, decisions),
        "use_liger_kernel": decisions.liger.value,
        "logging_nan_inf_filter": decisions.nan_inf_filter.value,
    }
    if decisions.non_blocking.value:
        args["accelerator_config"] = {"non_blocking": True}
    return args
