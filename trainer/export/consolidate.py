"""Sharded checkpoints -> one ordinary state dict, with the sharding libraries' own tools.

- DeepSpeed ZeRO (global_step*/ *_model_states.pt + optimizer shards): deepspeed.utils.zero_to_fp32, which rebuilds
  the fp32 master weights from every rank's partitions.
- FSDP's sharded state dict (pytorch_model_fsdp_*/, torch.distributed.checkpoint): accelerate's merge_fsdp_weights,
  which runs torch's dcp_to_torch_save and writes model.safetensors.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from trainer.errors import ConfigError

log = logging.getLogger("trainer")


def zero_state_dict(folder: Path) -> dict[str, Any]:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    tags = sorted(folder.glob("global_step*"), key=lambda p: int("".join(c for c in p.name if c.isdigit()) or 0))
    tag = (folder / "latest").read_text().strip() if (folder / "latest").is_file() else tags[-1].name
    log.info("export: consolidating DeepSpeed ZeRO shards %s with zero_to_fp32", folder / tag)
    return get_fp32_state_dict_from_zero_checkpoint(str(folder), tag=tag)


def fsdp_state_dict(folder: Path) -> dict[str, Any]:
    from accelerate.utils import merge_fsdp_weights
    from safetensors.torch import load_file

    shards = sorted(p for p in folder.glob("pytorch_model_fsdp_*") if p.is_dir())
    log.info("export: consolidating FSDP shards %s with accelerate's merge_fsdp_weights", shards[0])
    with tempfile.TemporaryDirectory(prefix="trainkit-fsdp-") as tmp:
        merge_fsdp_weights(str(shards[0]), tmp, safe_serialization=True)
        files = sorted(Path(tmp).glob("*.safetensors"))
        state: dict[str, Any] = {}
        for path in files:
            state.update(load_file(str(path)))
    return state


def model_from_state_dict(config_folder: Path, state: dict[str, Any]) -> Any:
    """The checkpoint's architecture (its config.json) with `state` loaded; every weight must be there."""
    from trainer.model.loading import LoadHow, Weights, load

    model = load(Weights(folder=str(config_folder), fresh=True), LoadHow(dtype="float32"))
    state = {k.removeprefix("module."): v for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {k for k in missing if model.config.tie_word_embeddings and k.endswith("lm_head.weight")}
    missing = sorted(set(missing) - tied)
    if missing or unexpected:
        raise ConfigError(f"export {config_folder}: the consolidated weights do not fit its config.json "
                          f"(missing {missing[:5]}, unexpected {list(unexpected)[:5]})")  # fmt: skip
    if tied:
        model.tie_weights()
    return model
