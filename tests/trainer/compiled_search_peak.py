"""The compiled batch search in a fresh process, as a trainer runs it: `python compiled_search_peak.py`.

Probes the tiny preset compiled (tests/trainer/batch_search_ranks.py's stand-in device limit: 24 sequences), then
does what apply_auto_batch does after a search (reset the peak) and one real training step at batch 1. Prints one
JSON line: the search's result, dynamo's counters, and the peak memory before and after the reset. A fresh process,
because a long-lived one (a pytest session) keeps pages that no reset gives back.
"""

from __future__ import annotations

import json

import torch
from batch_search_ranks import tiny_model_with_memory_limit
from torch._dynamo.utils import counters

from trainer.config.schema import TrainSettings
from trainer.run.batch_search import search_batch
from trainer.run.metrics import peak_memory_bytes, reset_peak_memory


def main() -> None:
    settings = TrainSettings(model="tiny", seq_len=128, batch_size=8, compile="1")
    model = tiny_model_with_memory_limit(24)
    found, how = search_batch(model, settings, torch.device("cpu"), "fp32", 1 << 20, 64, None, compiled=True)
    result = {"batch": found.batch, "probes": found.probes, "how": how,
              "unique_graphs": counters["stats"]["unique_graphs"], "recompiles": dict(counters["recompiles"]),
              "grads_left": any(p.grad is not None for p in model.parameters()),
              "probes_peak": peak_memory_bytes()}  # fmt: skip
    reset_peak_memory()  # what apply_auto_batch does after the search
    optimizer = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, model.config.vocab_size, (1, 128))
    model(input_ids=ids, labels=ids).loss.backward()  # one real training step, eager, at batch 1
    optimizer.step()
    print(json.dumps({**result, "step_peak": peak_memory_bytes()}))


if __name__ == "__main__":
    main()
