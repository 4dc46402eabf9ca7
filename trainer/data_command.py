"""`python -m trainer data [--show N [--json]]`: tokenize TRAIN_DATA into the cache ahead of a run, exactly as the
run would, and show what the run will train on.

Without --show it prints one JSON line: the cache folder, sequences, tokens, seconds, tokens/s, cores, and the peak
resident memory of this process and of its largest worker process (when the cache already held the data, the
figures of the run that prepared it). With --show N it prints the first N packed sequences instead (the summary
line goes to the log on stderr): decoded, the trained tokens marked (coloured on a terminal, between ⟦ ⟧
otherwise), each record under its own rule; with --json, one JSON object per sequence holding exactly what the
run feeds the model: `input_ids`, `labels` (-100 where no loss is taken) and `position_ids`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from trainer.errors import EXIT_OK

STATS = ("tokens", "records", "seconds", "tokens_per_s", "cores", "workers", "skipped_lines", "peak_rss_worker_bytes")
IGNORE_INDEX = -100
OPEN, CLOSE = "⟦", "⟧"


def register(commands: Any) -> None:
    """Add `data` to `python -m trainer`'s subcommands."""
    parser = commands.add_parser(
        "data",
        help="tokenize TRAIN_DATA into the cache ahead of a run; --show N prints what the run trains on",
        description="Prepare the tokenized cache of TRAIN_DATA with the same TRAIN_* settings as the run (one JSON "
        "summary line), or show its first packed sequences with the trained tokens marked.",
    )
    parser.add_argument("--show", type=int, metavar="N", help="print the first N packed sequences")
    parser.add_argument("--json", action="store_true", help="with --show: one JSON object per sequence "
                        "(input_ids, labels, position_ids: what the model is fed)")  # fmt: skip
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if args.json and args.show is None:
        from trainer.errors import ConfigError

        raise ConfigError("--json goes with --show N (the summary line is JSON already)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    from trainer.config import load_inputs
    from trainer.data.dataset import load_or_prepare
    from trainer.data.shards import peak_rss_bytes
    from trainer.tokenizer import tokenizer_for

    inputs = load_inputs()
    choice = inputs.template()
    tokenizer = tokenizer_for(inputs.tokenizer_folder, choice.text, choice.origin, choice.from_setting)
    dataset = load_or_prepare(inputs.data, tokenizer, inputs.data_spec, inputs.cache_dir)
    summary = {"folder": str(dataset.folder), "sequences": len(dataset), **{k: dataset.meta.get(k) for k in STATS}}
    summary["peak_rss_bytes"] = peak_rss_bytes()
    if args.show is None:
        print(json.dumps(summary))
        return EXIT_OK
    logging.getLogger("trainer").info("data: %s", json.dumps(summary))
    items = (fed_to_model(dataset[i]) for i in range(min(max(args.show, 0), len(dataset))))
    if args.json:
        for index, item in enumerate(items):
            print(json.dumps({"sequence": index, **item}))
    else:
        show_sequences(items, tokenizer)
    return EXIT_OK


def fed_to_model(item: dict[str, Any]) -> dict[str, list[int]]:
    """A dataset item as lists: what the collator stacks into the model's batch. An item without position_ids
    (stream packing) is fed without them, so the model counts 0..seq_len-1: that is what is shown."""
    out = {key: value.tolist() for key, value in item.items()}
    out.setdefault("position_ids", list(range(len(out["input_ids"]))))
    return out


def records_of(item: dict[str, list[int]]) -> list[tuple[int, int]]:
    """(start, stop) of each record in a sequence: a record starts where position_ids restart at 0."""
    positions = item["position_ids"]
    starts = [i for i, p in enumerate(positions) if p == 0] or [0]
    if starts[0] != 0:
        starts.insert(0, 0)
    return list(zip(starts, [*starts[1:], len(positions)], strict=True))


def show_sequences(items: Any, tokenizer: Any) -> None:
    from rich.console import Console

    console = Console(highlight=False, soft_wrap=True)
    marks = not console.is_terminal  # no colour to show what is trained: markers instead
    legend = f"{OPEN}trained{CLOSE}" if marks else "[bold green]trained[/], [dim]not trained[/]"
    console.print(f"Trained tokens: {legend}; each record starts under a rule.", markup=not marks)
    for index, item in enumerate(items):
        trained = sum(label != IGNORE_INDEX for label in item["labels"])
        console.rule(f"sequence {index}: {len(item['input_ids'])} tokens, {trained} trained", characters="═")
        for number, (start, stop) in enumerate(records_of(item)):
            console.rule(f"record {number} (tokens {start}-{stop - 1})", align="left")
            console.print(_record_text(item, start, stop, tokenizer, marks))


def _record_text(item: dict[str, list[int]], start: int, stop: int, tokenizer: Any, marks: bool) -> Any:
    """The record decoded in runs of trained / not trained tokens; padding (attention_mask 0, or untrained pad
    tokens) is counted."""
    from rich.text import Text

    text = Text()
    ids, labels = item["input_ids"], item["labels"]
    attention = list(item.get("attention_mask") or [1] * len(ids))
    for i, (token, label) in enumerate(zip(ids, labels, strict=True)):
        if token == tokenizer.pad_token_id and label == IGNORE_INDEX:
            attention[i] = 0
    pos = start
    while pos < stop:
        trained, real = labels[pos] != IGNORE_INDEX, attention[pos] == 1
        end = pos
        while end < stop and (labels[end] != IGNORE_INDEX) == trained and (attention[end] == 1) == real:
            end += 1
        if not real:
            text.append(f"[padding x{end - pos}]", style="dim italic")
        else:
            decoded = tokenizer.decode(ids[pos:end], skip_special_tokens=False)
            if trained:
                text.append(f"{OPEN}{decoded}{CLOSE}" if marks else decoded, style="bold green")
            else:
                text.append(decoded, style="dim")
        pos = end
    return text
