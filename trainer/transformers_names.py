"""What Transformers accepts, known without importing it: everything about `TrainingArguments` that must be known
before torch is imported (beside trainer.compat, which says what differs between the installed versions).

- the optimizer names this Transformers version accepts (a static copy, checked against the real enum by a test),
  plus the libraries each one needs;
- the names of the TrainingArguments fields, read from transformers' source with `ast` (no import), so an unknown
  flag in TRAIN_ARGS is refused in milliseconds;
- parsing TRAIN_ARGS with transformers' own HfArgumentParser once the heavy imports are allowed.
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib.util
import shlex
from pathlib import Path
from typing import Any

from trainer.errors import ConfigError
from trainer.secrets import is_secret_name, is_secret_value, mask_args, mask_args_text

# transformers.training_args.OptimizerNames (transformers 5.23); tests/trainer/test_config.py keeps it in sync.
OPTIMIZER_NAMES: tuple[str, ...] = (
    "adamw_torch", "adamw_torch_fused", "adamw_torch_xla", "adamw_torch_npu_fused", "adafactor",
    "adamw_anyprecision", "adamw_torch_4bit", "adamw_torch_8bit", "ademamix", "sgd", "adagrad",
    "adamw_bnb_8bit", "adamw_8bit", "ademamix_8bit", "lion_8bit", "lion_32bit", "paged_adamw_32bit",
    "paged_adamw_8bit", "paged_ademamix_32bit", "paged_ademamix_8bit", "paged_lion_32bit", "paged_lion_8bit",
    "rmsprop", "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit", "galore_adamw", "galore_adamw_8bit",
    "galore_adafactor", "galore_adamw_layerwise", "galore_adamw_8bit_layerwise", "galore_adafactor_layerwise",
    "lomo", "adalomo", "grokadamw", "schedule_free_radam", "schedule_free_adamw", "schedule_free_sgd",
    "apollo_adamw", "apollo_adamw_layerwise", "stable_adamw",
)  # fmt: skip

# The Transformers release that added each name above newer than the oldest row's transformers (4.46), read from each
# release's OptimizerNames: what a described stack (an image row's, scripts/matrix.py) refuses. The installed
# transformers is read itself (compat.installed_optimizer_names); tests/trainer/test_rows.py holds the two equal.
OPTIMIZERS_ADDED: dict[str, tuple[int, int]] = {
    "adamw_torch_8bit": (4, 49), "schedule_free_radam": (4, 49), "apollo_adamw": (4, 49),
    "apollo_adamw_layerwise": (4, 49), "stable_adamw": (4, 54),
}  # fmt: skip

# Optimizers trainkit adds on top of Transformers' list (Transformers 5 dropped apex): built by the trainer itself.
APEX_FUSED = "adamw_apex_fused"
TRAINKIT_OPTIMIZERS: tuple[str, ...] = (APEX_FUSED,)

BNB_OPTIMIZERS = frozenset(
    {
        "adamw_bnb_8bit", "adamw_8bit", "ademamix", "ademamix_8bit", "lion_8bit", "lion_32bit",
        "paged_adamw_32bit", "paged_adamw_8bit", "paged_ademamix_32bit", "paged_ademamix_8bit",
        "paged_lion_32bit", "paged_lion_8bit", "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit",
    }
)  # fmt: skip

# (python module to find, pip/install hint) for each optimizer that needs more than torch.
_PREFIX_LIBRARIES = {
    "galore_": ("galore_torch", "pip install galore-torch"),
    "apollo_": ("apollo_torch", "pip install apollo-torch"),
    "schedule_free_": ("schedulefree", "pip install schedulefree"),
}
_NAME_LIBRARIES = {
    "adamw_torch_xla": ("torch_xla", "torch_xla (TPU only)"),
    "adamw_torch_npu_fused": ("torch_npu", "torch_npu (Ascend NPU only)"),
    "adamw_anyprecision": ("torchdistx", "pip install torchdistx"),
    "adamw_torch_4bit": ("torchao", "pip install torchao"),
    "adamw_torch_8bit": ("torchao", "pip install torchao"),
    "lomo": ("lomo_optim", "pip install lomo-optim"),
    "adalomo": ("lomo_optim", "pip install lomo-optim"),
    "grokadamw": ("grokadamw", "pip install grokadamw"),
    "stable_adamw": ("optimi", "pip install torch-optimi"),
}

# TrainingArguments flags that trainkit owns: set through TRAIN_* so its checks and outputs stay consistent.
RESERVED_FLAGS = {
    "output_dir": "TRAIN_OUTPUT_DIR",
    "deepspeed": "TRAIN_DEEPSPEED_CONFIG (or TRAIN_ZERO_STAGE)",
    "resume_from_checkpoint": "TRAIN_RESUME",
}
# Flags that follow a decision which other parts read too (the attention choice, QLoRA's compute dtype, the
# DeepSpeed config, LoRA with checkpointing...): overriding them in TRAIN_ARGS would leave those parts on the old value.
DECIDED_FLAGS = {
    "bf16": "TRAIN_PRECISION",
    "fp16": "TRAIN_PRECISION",
    "tf32": "TRAIN_TF32",
    "optim": "TRAIN_OPTIM",
    "torch_compile": "TRAIN_COMPILE",
    "torch_compile_backend": "TRAIN_COMPILE_BACKEND",
    "torch_compile_mode": "TRAIN_COMPILE_MODE",
    "gradient_checkpointing": "TRAIN_GRAD_CKPT",
    "activation_checkpointing": "TRAIN_GRAD_CKPT",
    "fsdp": "TRAIN_FSDP",
    "fsdp_config": "TRAIN_FSDP",
    "dataloader_pin_memory": "TRAIN_PIN_MEMORY",
    "use_liger_kernel": "TRAIN_LIGER",
    "full_determinism": "TRAIN_DETERMINISTIC",
}


def all_optimizer_names() -> tuple[str, ...]:
    return OPTIMIZER_NAMES + TRAINKIT_OPTIMIZERS


def optimizer_library(name: str) -> tuple[str, str] | None:
    """(module, install hint) an optimizer needs besides torch, or None."""
    if name in BNB_OPTIMIZERS:
        return "bitsandbytes", "pip install bitsandbytes"
    if name == APEX_FUSED:
        return "apex.optimizers", "NVIDIA apex built with --cuda_ext (the PyPI package `apex` is unrelated)"
    if name in _NAME_LIBRARIES:
        return _NAME_LIBRARIES[name]
    for prefix, lib in _PREFIX_LIBRARIES.items():
        if name.startswith(prefix):
            return lib
    return None


def closest(name: str, choices: list[str] | tuple[str, ...]) -> str | None:
    found = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(name: str, choices: list[str] | tuple[str, ...]) -> str:
    match = closest(name, choices)
    return f" (did you mean {match}?)" if match else ""


# ---- TrainingArguments fields without importing transformers -----------------------------------------------------


def training_args_source() -> Path | None:
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "training_args.py"
    return path if path.is_file() else None


@functools.lru_cache(maxsize=1)
def training_argument_fields() -> frozenset[str]:
    """Field names of transformers.TrainingArguments, read from its source; empty when transformers is absent."""
    source = training_args_source()
    if source is None:
        return frozenset()
    tree = ast.parse(source.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "TrainingArguments":
            return frozenset(
                item.target.id
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                and not item.target.id.startswith("_")
            )  # fmt: skip
    return frozenset()


# ---- TRAIN_ARGS -------------------------------------------------------------------------------------------------


def split_train_args(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as exc:
        shown = mask_args_text(text)
        raise ConfigError(
            f"TRAIN_ARGS={shown!r} cannot be parsed ({exc}); quote it like a shell command line"
        ) from None


def _flag_field(token: str) -> str:
    return token[2:].split("=", 1)[0].replace("-", "_")


SECRET_HINT = (
    "Transformers saves every TrainingArguments value into training_args.bin in each checkpoint and in final/; "
    "pass the Hub token as HF_TOKEN, or better as a file named by HF_TOKEN_PATH (never saved, never in "
    "`docker inspect`)"
)


def secret_problems(tokens: list[str]) -> list[str]:
    """A secret in TRAIN_ARGS (a token flag, or a value shaped like a secret) would be pickled into every checkpoint:
    refused, naming the flag but never the value."""
    problems = [
        f"TRAIN_ARGS: --{_flag_field(token)} holds a secret; {SECRET_HINT}"
        for token in tokens
        if token.startswith("--") and is_secret_name(token)
    ]
    if not problems and any(is_secret_value(token) for token in tokens):
        problems.append(f"TRAIN_ARGS holds a value shaped like a secret (an hf_ token or a URL's user:password); "
                        f"{SECRET_HINT}")  # fmt: skip
    return problems


def check_train_args(tokens: list[str], extra_fields: frozenset[str] = frozenset(),
                     owner: str = "TrainingArguments") -> list[str]:
    """Problems with the flags in TRAIN_ARGS that can be found without importing transformers; `extra_fields` are
    those a TrainingArguments subclass adds (`owner`, e.g. TRL's DPOConfig)."""
    fields = training_argument_fields() | extra_fields if training_argument_fields() else frozenset()
    problems = secret_problems(tokens)
    if tokens and not tokens[0].startswith("--"):
        problems.append(
            f"TRAIN_ARGS must start with a --flag, got {mask_args(tokens[:1])[0]!r} (e.g. '--weight_decay 0.1')"
        )
    for token in tokens:
        if not token.startswith("--"):
            continue
        name = _flag_field(token)
        base = name[3:] if name.startswith("no_") and name[3:] in DECIDED_FLAGS else name
        if is_secret_name(token):
            continue  # refused above
        if name in RESERVED_FLAGS:
            problems.append(f"TRAIN_ARGS: --{name} is set by trainkit; use {RESERVED_FLAGS[name]} instead")
        elif base in DECIDED_FLAGS:
            variable = DECIDED_FLAGS[base]
            problems.append(
                f"TRAIN_ARGS: --{name} would contradict {variable}, from which trainkit decides it (the run, its "
                f"record and every part that reads the decision must agree); set {variable} instead"
            )
        elif fields and name not in fields and not (name.startswith("no_") and name[3:] in fields):
            problems.append(f"TRAIN_ARGS: --{name} is not a {owner} flag{did_you_mean(name, sorted(fields))}")
    return problems


def parse_train_args(tokens: list[str], arguments_class: Any = None) -> dict[str, Any]:
    """The TrainingArguments (or `arguments_class`, a subclass such as TRL's DPOConfig) values given in TRAIN_ARGS
    (only those), parsed by transformers' HfArgumentParser."""
    if not tokens:
        return {}
    from transformers import HfArgumentParser, TrainingArguments

    parser = HfArgumentParser(arguments_class or TrainingArguments)

    def refuse(message: str) -> None:
        raise ConfigError(f"TRAIN_ARGS: {message}")

    parser.error = refuse  # argparse would print usage and exit
    unset = object()
    parser.set_defaults(**{action.dest: unset for action in parser._actions if action.dest != "help"})
    for action in parser._actions:
        action.required = False  # transformers 4.x requires --output_dir; trainkit sets it (TRAIN_OUTPUT_DIR)
    namespace, rest = parser.parse_known_args(tokens)
    if rest:
        raise ConfigError(f"TRAIN_ARGS: unrecognized arguments {' '.join(rest)}")
    return {key: value for key, value in vars(namespace).items() if value is not unset}
