"""The DeepSpeed ZeRO config generated from TRAIN_ZERO_STAGE/TRAIN_ZERO_OFFLOAD/TRAIN_NVME_PATH, and the user's JSON
read; the sharding group (trainer/config/sharding.py) decides which one a run uses.

Values set to "auto" are filled in by the Hugging Face Trainer from TrainingArguments (batch sizes, gradient
accumulation, clipping, optimizer/scheduler hyper-parameters), so the two can never disagree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainer.config.precision import deepspeed_blocks as precision_blocks
from trainer.errors import ConfigError

# Asynchronous I/O settings for NVMe offload (DeepSpeed's `aio` block); DeepSpeed's own defaults, written out so
# run_config.json shows what is used.
AIO_DEFAULTS = {
    "block_size": 1048576,
    "queue_depth": 8,
    "intra_op_parallelism": 1,
    "single_submit": False,
    "overlap_events": True,
}


def load_user_config(path: str) -> dict[str, Any]:
    """TRAIN_DEEPSPEED_CONFIG: a JSON object, or a ConfigError saying what is wrong with the file."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"TRAIN_DEEPSPEED_CONFIG={path!r}: no such file; give the path of a DeepSpeed JSON config")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"TRAIN_DEEPSPEED_CONFIG={path!r}: cannot read it ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"TRAIN_DEEPSPEED_CONFIG={path!r} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"TRAIN_DEEPSPEED_CONFIG={path!r} must hold a JSON object, not {type(data).__name__}")
    return data


NVME_BUFFER_DEFAULT = 100_000_000  # DeepSpeed's offload_param.buffer_size, in elements
NVME_BUFFER_ROUND = 10_000_000


def largest_tensor_elements(model: str) -> int:
    """The largest weight of a model folder, from its config.json (embeddings are usually it: Llama-3-8B's are
    128256 x 4096 = 525M); 0 when unknown. Presets stay far below DeepSpeed's default NVMe buffer."""
    try:
        cfg = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0
    cfg = cfg.get("text_config", cfg) if isinstance(cfg, dict) else {}
    hidden = int(cfg.get("hidden_size") or cfg.get("n_embd") or 0)
    widths = (cfg.get("vocab_size"), cfg.get("intermediate_size"), cfg.get("n_inner"), hidden)
    return max((int(w) * hidden for w in widths if isinstance(w, int)), default=0)


def nvme_buffer_size(largest: int) -> int:
    """offload_param.buffer_size: each NVMe swap buffer must hold the largest tensor, or DeepSpeed asserts
    "More elements than buffer size"; rounded up, never below DeepSpeed's default."""
    rounded = -(-largest // NVME_BUFFER_ROUND) * NVME_BUFFER_ROUND
    return max(NVME_BUFFER_DEFAULT, rounded)


def _offload(device: str, nvme_path: str, pin_memory: bool) -> dict[str, Any]:
    block: dict[str, Any] = {"device": device, "pin_memory": pin_memory}
    if device == "nvme":
        block["nvme_path"] = nvme_path
    return block


def _zero_block(stage: int, offload: str, nvme_path: str, largest: int) -> dict[str, Any]:
    pin = offload == "cpu"
    zero: dict[str, Any] = {
        "stage": stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": "auto",
    }
    if stage == 3:
        zero.update(
            {
                "stage3_prefetch_bucket_size": "auto",
                "stage3_param_persistence_threshold": "auto",
                "stage3_max_live_parameters": 1e9,
                "stage3_max_reuse_distance": 1e9,
                "stage3_gather_16bit_weights_on_model_save": True,
                "sub_group_size": 1e9,
            }
        )
    else:
        zero.update({"allgather_partitions": True, "allgather_bucket_size": 2e8, "reduce_scatter": True})
    if offload != "none":
        zero["offload_optimizer"] = _offload(offload, nvme_path, pin)
        if stage == 3:
            zero["offload_param"] = _offload(offload, nvme_path, pin)
            if offload == "nvme":
                zero["offload_param"]["buffer_size"] = nvme_buffer_size(largest)
    return zero


def generate(stage: int, offload: str, nvme_path: str, precision: str, largest_tensor: int = 0) -> dict[str, Any]:
    """A ZeRO config for `stage` (1-3), offloading to `offload` (none|cpu|nvme), in `precision` (a precision decision);
    `largest_tensor` (elements) sizes the NVMe swap buffers."""
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_optimization": _zero_block(stage, offload, nvme_path, largest_tensor),
        "steps_per_print": 1_000_000,  # the trainer logs; keep DeepSpeed quiet
        "wall_clock_breakdown": False,
        **precision_blocks(precision),
    }
    if offload == "nvme":
        config["aio"] = dict(AIO_DEFAULTS)
    if offload != "none":
        # With offload the optimizer step runs where the states live: DeepSpeed's own AdamW (DeepSpeedCPUAdam for cpu
        # and nvme) replaces TRAIN_OPTIM; "auto" takes lr/betas/eps/weight decay from TrainingArguments.
        config["optimizer"] = {
            "type": "AdamW",
            "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
        }
    return config


def replaces_optimizer(config: dict[str, Any]) -> bool:
    """True when the DeepSpeed config builds its own optimizer (TRAIN_OPTIM is then not used)."""
    return "optimizer" in config
