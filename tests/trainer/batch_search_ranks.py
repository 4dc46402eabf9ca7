"""Two real ranks search a batch together: `torchrun --nproc-per-node 2 batch_search_ranks.py FOLDER`.

Each rank probes the tiny preset on its CPU through `memory_probe`, with a device memory limit standing in for
the GPU's: above LIMITS[rank] sequences, the forward pass raises the out-of-memory error a GPU raises (rank 1's
device is the smaller one). Each rank writes FOLDER/search.<rank>.json: the batch and the sizes it probed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from trainer.compat import out_of_memory_error
from trainer.run.batch_search import agreed, memory_probe, search_largest
from trainer.run.signals import control_group

LIMITS = {0: 40, 1: 23}
START, CEILING, SEQ = 8, 256, 16


def tiny_model_with_memory_limit(limit: int) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    from trainer.model.build import preset_config
    from trainer.tokenizer import byte_level_tokenizer

    tok = byte_level_tokenizer()
    model = AutoModelForCausalLM.from_config(preset_config("tiny", len(tok), SEQ, tok))

    @torch.compiler.disable  # the stand-in runs as the device's allocator would: outside any compiled graph
    def device_memory(_module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if kwargs["input_ids"].shape[0] > limit:
            raise out_of_memory_error()("CUDA out of memory (the test's device limit)")

    model.register_forward_pre_hook(device_memory, with_kwargs=True)
    return model


def main() -> None:
    folder = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = tiny_model_with_memory_limit(LIMITS[rank])
    fits = memory_probe(model, SEQ, model.config.vocab_size, torch.device("cpu"), "fp32", reserve=1 << 20)
    found = search_largest(agreed(fits, control_group(dist.get_world_size())), START, CEILING)
    grads_left = any(p.grad is not None for p in model.parameters())
    out = {"batch": found.batch, "probes": found.probes, "grads_left": grads_left, "pid": os.getpid()}
    (folder / f"search.{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
