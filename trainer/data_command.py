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
from typing import TYPE_CHECKING, Any

from trainer.data.vision import has_images
from trainer.errors import EXIT_OK
from trainer.methods import of

if TYPE_CHECKING:
    from trainer.config.inputs import Inputs

STATS = ("tokens", "records", "seconds", "tokens_per_s", "cores", "workers", "skipped_lines", "peak_rss_worker_bytes")
IGNORE_INDEX = -100
OPEN, CLOSE = "⟦", "⟧"


def register(parser: argparse.ArgumentParser) -> None:
    """`data`'s arguments, on the parser trainer/__main__.py made for it (trainer/commands.py)."""
    parser.description = (
        "Prepare the tokenized cache of TRAIN_DATA with the same TRAIN_* settings as the run (one JSON "
        "summary line), or show its first packed sequences with the trained tokens marked."
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
    from trainer.data.mixed import prepare_mix
    from trainer.data.shards import peak_rss_bytes
    from trainer.tokenizer import tokenizer_for

    inputs = load_inputs()
    choice = inputs.template()
    tokenizer = tokenizer_for(inputs.tokenizer_folder, choice.text, choice.origin, choice.from_setting)
    data = of(inputs.settings.method).data  # what the method trains on (trainer/methods.py)
    if data == "prompts":
        return show_prompts(inputs, tokenizer, args.show, args.json)
    if data == "pairs":
        return show_pairs(inputs, tokenizer, args.show, args.json)
    if has_images(inputs.data.layouts):
        return show_images(inputs, tokenizer, args.show, args.json)
    if inputs.mix.is_mix:  # each source from its own cache, mixed as the run mixes them (trainer.data.mix)
        dataset, _ = prepare_mix(inputs.mix, inputs.mix_sources, tokenizer, inputs.data_spec, inputs.cache_dir,
                                 inputs.settings.seed)  # fmt: skip
        summary = {"sequences": len(dataset), "mix": dataset.report}
    else:
        dataset = load_or_prepare(inputs.data, tokenizer, inputs.data_spec, inputs.cache_dir)
        summary = {"folder": str(dataset.folder), "sequences": len(dataset),
                   **{k: dataset.meta.get(k) for k in STATS}}  # fmt: skip
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


def show_prompts(inputs: Inputs, tokenizer: Any, count: int | None, as_json: bool) -> int:
    """Online RL's data: a summary line, or its first `count` prompts as the model is given them (conversations
    through the chat template with its generation prompt) with the columns the rewards receive."""
    from trainer.data.mixed import training_prompts
    from trainer.data.prompts import rendered

    records, mix = training_prompts(inputs.prompts, list(inputs.mix.entries), inputs.settings.seed)
    summary = {"method": inputs.settings.method, "records": len(records.rows), "skipped_lines": len(records.skipped),
               "prompts": "messages" if records.chat else "text", **({"mix": mix} if mix else {})}  # fmt: skip
    if count is None:
        print(json.dumps(summary))
        return EXIT_OK
    logging.getLogger("trainer").info("data: %s", json.dumps(summary))
    for index, (row, where) in enumerate(zip(records.rows[: max(count, 0)], records.wheres, strict=False)):
        text = rendered(tokenizer, row["prompt"])
        columns = {k: v for k, v in row.items() if k != "prompt"}
        if as_json:
            print(json.dumps({"prompt": index, "where": where, "text": text,
                              "input_ids": tokenizer(text, add_special_tokens=not records.chat)["input_ids"],
                              "columns": columns}, default=str))  # fmt: skip
        else:
            print(f"--- prompt {index} ({where}) ---\n{text}\n--- columns for the rewards: {json.dumps(columns)}")
    return EXIT_OK


def show_pairs(inputs: Inputs, tokenizer: Any, count: int | None, as_json: bool) -> int:
    """A preference method's data: a summary line, or its first `count` pairs (KTO examples) as TRL tokenizes them:
    the prompt never trained, each side's answer trained; cut at TRAIN_PREF_MAX_PROMPT_LEN and TRAIN_SEQ_LEN as the
    run cuts them."""
    from trainer.config.method import records_of
    from trainer.data.preference import encoded, limit_prompts, longest, prompt_tokens

    settings = inputs.settings
    records = records_of(inputs)
    summary = {"method": settings.method, "records": len(records.rows), "layouts": records.layouts,
               "skipped_lines": len(records.skipped)}  # fmt: skip
    if count is None:
        summary["longer_than_seq_len"] = sum(longest(encoded(tokenizer, row)) > settings.seq_len
                                             for row in records.rows)  # fmt: skip
        limit = settings.pref_max_prompt_len
        if limit:
            summary["prompts_longer_than_limit"] = sum(prompt_tokens(tokenizer, r["prompt"]) > limit
                                                       for r in records.rows)  # fmt: skip
        print(json.dumps(summary))
        return EXIT_OK
    logging.getLogger("trainer").info("data: %s", json.dumps(summary))
    shown = []
    for row, where in zip(records.rows, records.wheres, strict=True):
        if len(shown) == max(count, 0):
            break
        limited = limit_prompts([row], tokenizer, settings.pref_max_prompt_len, settings.long_records).rows
        if not limited:
            continue
        item = encoded(tokenizer, limited[0])
        too_long = longest(item) > settings.seq_len if settings.long_records == "drop" else (
            len(item["prompt_ids"]) >= settings.seq_len)  # truncate: TRL drops a prompt that fills TRAIN_SEQ_LEN
        if too_long:
            continue
        sides = {side: _side(item["prompt_ids"], item[f"{side}_ids"], settings.seq_len)
                 for side in ("chosen", "rejected", "completion") if f"{side}_ids" in item}  # fmt: skip
        shown.append({"pair": len(shown), "where": where, **sides,
                      **({"label": item["label"]} if "label" in item else {})})  # fmt: skip
    if as_json:
        for pair in shown:
            print(json.dumps(pair))
    else:
        _print_pairs(shown, tokenizer)
    return EXIT_OK


def _side(prompt_ids: list[int], answer_ids: list[int], seq_len: int) -> dict[str, list[int]]:
    """One side as the model is fed it: the prompt (labels -100) then the answer, cut after seq_len tokens."""
    ids = (prompt_ids + answer_ids)[:seq_len]
    labels = ([IGNORE_INDEX] * len(prompt_ids) + answer_ids)[:seq_len]
    return {"input_ids": ids, "labels": labels}


def _print_pairs(shown: list[dict[str, Any]], tokenizer: Any) -> None:
    from rich.console import Console

    console = Console(highlight=False, soft_wrap=True)
    marks = not console.is_terminal
    legend = f"{OPEN}trained{CLOSE}" if marks else "[bold green]trained[/], [dim]not trained[/]"
    console.print(f"Trained tokens: {legend}; the prompt, then each side's answer.", markup=not marks)
    for pair in shown:
        label = f", label {str(pair['label']).lower()}" if "label" in pair else ""
        console.rule(f"pair {pair['pair']} ({pair['where']}{label})", characters="═")
        for side in ("chosen", "rejected", "completion"):
            if side in pair:
                item = {**pair[side], "position_ids": list(range(len(pair[side]["input_ids"])))}
                console.rule(side, align="left")
                console.print(_record_text(item, 0, len(item["input_ids"]), tokenizer, marks))


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


def show_images(inputs: Inputs, tokenizer: Any, count: int | None, as_json: bool) -> int:
    """Records with images: a summary line, or the first `count` records as the run encodes them, each image a
    marker with its size and the tokens it becomes, the trained tokens marked."""
    from trainer.run.vision import encoder_for, processor_for, training_images

    processor = processor_for(inputs, tokenizer)
    dataset = training_images(inputs, encoder_for(inputs, processor))
    tokens = dataset.image_tokens()
    summary = {"records": len(dataset), "images": dataset.read.images(), "image_tokens": sum(tokens),
               "image_tokens_per_record": [min(tokens), max(tokens)], "dropped_too_long": dataset.dropped,
               "skipped_records": len(dataset.read.bad)}  # fmt: skip
    if count is None:
        print(json.dumps(summary))
        return EXIT_OK
    logging.getLogger("trainer").info("data: %s", json.dumps(summary))
    for index in range(min(max(count, 0), len(dataset))):
        record, encoded = dataset.records[index], dataset.encoded[index]
        ids = [int(i) for i in encoded.ids[: encoded.kept]]
        labels = [i if t else IGNORE_INDEX for i, t in zip(ids, encoded.trained[: encoded.kept], strict=True)]
        images = [{"sha256": f.sha256, "width": f.width, "height": f.height, "tokens": end - start,
                   "first_token": start} for f, (start, end) in zip(record.facts, encoded.image_spans, strict=True)]
        if as_json:
            print(json.dumps({"record": index, "where": record.where, "input_ids": ids, "labels": labels,
                              "images": images}))  # fmt: skip
        else:
            print(f"--- record {index} ({record.where}): {len(ids)} tokens, {sum(t != IGNORE_INDEX for t in labels)} "
                  f"trained ---\n{_with_markers(ids, labels, images, tokenizer)}")  # fmt: skip
    return EXIT_OK


def _with_markers(ids: list[int], labels: list[int], images: list[dict[str, Any]], tokenizer: Any) -> str:
    """The record decoded, trained runs between ⟦ ⟧, each image's tokens one marker: [image WxH: N tokens]."""
    at = {image["first_token"]: image for image in images}
    out, pos = [], 0
    while pos < len(ids):
        if pos in at:
            image = at[pos]
            out.append(f"[image {image['width']}x{image['height']}: {image['tokens']} tokens]")
            pos += image["tokens"]
            continue
        trained, end = labels[pos] != IGNORE_INDEX, pos
        while end < len(ids) and end not in at and (labels[end] != IGNORE_INDEX) == trained:
            end += 1
        text = tokenizer.decode(ids[pos:end], skip_special_tokens=False)
        out.append(f"{OPEN}{text}{CLOSE}" if trained else text)
        pos = end
    return "".join(out)
