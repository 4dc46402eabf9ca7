"""Does attention stay inside each packed record? Run by tests/trainer/test_packing.py on the project's venv and on
the oldest row's (.venv-oldest), so each stack answers for itself.

    python tests/trainer/packed_isolation.py DATA_FILE OUTPUT_DIR [TRAIN_ATTN[:compiled] ...]

Builds the dataset and the model exactly as a training run does (settings from TRAIN_* with the user's defaults,
trainer.data.dataset.load_or_prepare, trainer.run.training_model.build_model, the run's collator), feeds one batch of
packed
sequences, and compares each trained token's loss with the same record's loss computed alone. Prints one JSON line
per attention implementation: the largest difference, and how many records and trained tokens were compared.
`:compiled` builds the model with TRAIN_COMPILE=1 (its decoder layers compiled in place, as a run does) and computes
the records alone with the compiled code set aside (torch.compiler's force_eager stance).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sys

import torch


def per_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each token's prediction of the next label, one per token (0 where the next label is -100,
    and for the last token of a row)."""
    targets = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=-100)
    losses = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), reduction="none"
    )
    return losses.reshape(labels.shape)


def compare(attn: str, data: str, output_dir: str, compiled: bool = False) -> dict[str, object]:
    from trainer.config import load_inputs, resolve
    from trainer.data.dataset import load_or_prepare
    from trainer.model.packed_attention import collator_for
    from trainer.run.training_model import build_model
    from trainer.tokenizer import tokenizer_for

    env = {"TRAIN_DATA": data, "TRAIN_OUTPUT_DIR": output_dir, "TRAIN_SEQ_LEN": "96", "TRAIN_ATTN": attn,
           "TRAIN_COMPILE": "1" if compiled else "auto"}  # fmt: skip
    inputs = load_inputs(env)
    cfg = resolve(inputs)
    choice = inputs.template()
    tokenizer = tokenizer_for(inputs.tokenizer_folder, choice.text, choice.origin, choice.from_setting)
    dataset = load_or_prepare(inputs.data, tokenizer, inputs.data_spec, inputs.cache_dir)
    torch.manual_seed(0)
    model = build_model(cfg, tokenizer).train()  # as Trainer runs it (no dropout in Llama)
    items = sorted((dataset[i] for i in range(len(dataset))), key=lambda it: -int((it["position_ids"] == 0).sum()))
    batch = collator_for(cfg.decisions.attn.value)(items[:4])  # the sequences holding the most records
    with torch.no_grad():
        packed = per_token_loss(model(**batch).logits, batch["labels"]).reshape(-1)
        ids, labels = batch["input_ids"].reshape(-1), batch["labels"].reshape(-1)
        starts = [*(batch["position_ids"].reshape(-1) == 0).nonzero().reshape(-1).tolist(), len(ids)]
        worst, records, tokens = 0.0, 0, 0
        for start, end in itertools.pairwise(starts):
            if (labels[start:end] == -100).all():
                continue  # padding
            with torch.compiler.set_stance("force_eager") if compiled else contextlib.nullcontext():
                alone = model(input_ids=ids[None, start:end]).logits
            alone = per_token_loss(alone, labels[None, start:end]).reshape(-1)
            worst = max(worst, (packed[start:end] - alone).abs().max().item())
            records, tokens = records + 1, tokens + int((labels[start + 1 : end] != -100).sum())
    name = attn + (":compiled" if compiled else "")
    return {"attn": name, "max_diff": worst, "records": records, "trained_tokens": tokens,
            "sequences": len(dataset), "meta": dataset.meta["packing"]}  # fmt: skip


def main() -> None:
    data, output_dir, *attns = sys.argv[1:]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for attn in attns or ["auto"]:
        name, _, how = attn.partition(":")
        print(json.dumps(compare(name, data, output_dir, compiled=how == "compiled")), flush=True)


if __name__ == "__main__":
    main()
