"""Two real ranks search a batch together: `torchrun --nproc-per-node 2 batch_search_ranks.py FOLDER`.

Each rank probes the tiny preset on its CPU through `memory_probe`, with a stand-in for the GPU's memory
(StandInDevice): the forward pass at batch b takes BASE + PER_SEQUENCE * b at its peak, and above the device's
capacity raises the out-of-memory error a GPU raises (rank 1's device is the smaller one). Each rank writes
FOLDER/search.<rank>.json: the batch and the sizes it probed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from trainer.compat import out_of_memory_error
from trainer.run.batch_fit import HEADROOM, agreed, agreed_limit, memory_limit, search_predicted
from trainer.run.batch_search import memory_probe
from trainer.run.signals import control_group

MIB = 1 << 20
BASE, PER_SEQUENCE = 200 * MIB, 10 * MIB
CAPACITY = {0: 40, 1: 23}  # the largest batch each rank's device holds at all, in sequences
START, CEILING, SEQ = 8, 256, 16


class StandInDevice:
    """A device that holds `sequences` sequences of the tiny preset at most: the peak of a forward and backward at
    batch b is BASE + PER_SEQUENCE * b, and a larger one than the capacity runs out of memory."""

    name = "stand-in device"

    def __init__(self, sequences: int) -> None:
        self.total = BASE + PER_SEQUENCE * sequences
        self._peak = 0

    def capacity(self) -> int:
        return self.total

    def reset_peak(self) -> None:
        self._peak = 0

    def peak(self) -> int:
        return self._peak

    def attach(self, model: torch.nn.Module) -> torch.nn.Module:
        @torch.compiler.disable  # the stand-in runs as the device's allocator would: outside any compiled graph
        def allocate(_module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            ids = kwargs.get("input_ids", args[0] if args else None)
            need = BASE + PER_SEQUENCE * ids.shape[0]
            if need > self.total:
                raise out_of_memory_error()("CUDA out of memory (the test's stand-in device)")
            self._peak = max(self._peak, need)

        model.register_forward_pre_hook(allocate, with_kwargs=True)
        return model


def largest_under_headroom(sequences: int) -> int:
    """What the search must end on for a device of `sequences`: the largest batch under the capacity less HEADROOM."""
    total = BASE + PER_SEQUENCE * sequences
    return (total - int(HEADROOM * total) - BASE) // PER_SEQUENCE


def tiny_model_on_standin(sequences: int) -> tuple[torch.nn.Module, StandInDevice]:
    from transformers import AutoModelForCausalLM

    from trainer.model.build import preset_config
    from trainer.tokenizer import byte_level_tokenizer

    tok = byte_level_tokenizer()
    device = StandInDevice(sequences)
    return device.attach(AutoModelForCausalLM.from_config(preset_config("tiny", len(tok), SEQ, tok))), device


def main() -> None:
    folder = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    group = control_group(dist.get_world_size())
    model, device = tiny_model_on_standin(CAPACITY[rank])
    probe = memory_probe(model, SEQ, model.config.vocab_size, torch.device("cpu"), "fp32", 1 << 20, device)
    found = search_predicted(agreed(probe, group), START, CEILING, agreed_limit(memory_limit(device), group))
    grads_left = any(p.grad is not None for p in model.parameters())
    out = {"batch": found.batch, "probes": found.probes, "grads_left": grads_left, "pid": os.getpid()}
    (folder / f"search.{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
