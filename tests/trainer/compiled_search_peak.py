"""The compiled batch search in a fresh process, as a trainer runs it: `python compiled_search_peak.py`.

The tiny preset with its decoder layers compiled in place (the trainer's default, regional compile) through a
backend that records, for each graph it is given, whether its shapes are symbolic (dynamic), then inductor.
The search probes it on tests/trainer/batch_search_ranks.py's stand-in device (24 sequences at most); then what
apply_auto_batch does after a search (reset the peak) and one eager step at batch 1 for the peak; then two
training steps at the batch chosen, compiled. Prints one JSON line: the search's result, the graphs compiled during
the search and by the training steps (dynamic or static), and the peak memory before and after the reset. A fresh
process, because a long-lived one (a pytest session) keeps pages that no reset gives back.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from batch_search_ranks import tiny_model_on_standin
from torch._dynamo import register_backend

from trainer.config.schema import TrainSettings
from trainer.run.batch_fit import memory_limit
from trainer.run.batch_search import search_batch
from trainer.run.metrics import peak_memory_bytes, reset_peak_memory
from trainer.run.training_model import compile_layers

GRAPHS: list[bool] = []  # per graph compiled: True where a shape is symbolic (dynamic)


@register_backend
def recorded_inductor(graph: Any, example_inputs: list[Any]) -> Any:
    from torch._inductor.compile_fx import compile_fx

    shapes = [s for x in example_inputs if isinstance(x, torch.Tensor) for s in x.shape]
    GRAPHS.append(any(isinstance(v, torch.SymInt) for v in [*example_inputs, *shapes]))
    return compile_fx(graph, example_inputs)


def train_step(model: torch.nn.Module, optimizer: Any, batch: int) -> None:
    ids = torch.randint(0, model.config.vocab_size, (batch, 128))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def main() -> None:
    settings = TrainSettings(model="tiny", seq_len=128, batch_size=8, compile="1", compile_backend="recorded_inductor")
    model, device = tiny_model_on_standin(24)
    compile_layers(model, settings.compile_backend, settings.compile_mode)
    found, how = search_batch(model, settings, torch.device("cpu"), "fp32", 1 << 20, 64, None, True, device,
                              memory_limit(device), settings.batch_size)  # fmt: skip
    result = {"batch": found.batch, "probes": found.probes, "how": how, "search_graphs": list(GRAPHS),
              "grads_left": any(p.grad is not None for p in model.parameters()),
              "probes_peak": peak_memory_bytes()}  # fmt: skip
    reset_peak_memory()  # what apply_auto_batch does after the search
    optimizer = torch.optim.AdamW(model.parameters())
    with torch.compiler.set_stance("force_eager"):
        train_step(model, optimizer, 1)  # one real training step, eager, at batch 1
    result["step_peak"] = peak_memory_bytes()
    del GRAPHS[:]
    train_step(model, optimizer, found.batch)
    result["first_step_graphs"] = list(GRAPHS)
    train_step(model, optimizer, found.batch)
    result["second_step_graphs"] = GRAPHS[len(result["first_step_graphs"]) :]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
