"""Preference data: the layouts TRL and the Hub use, read whole, checked record by record, and tokenized for show.

Layouts of a record (one per file; `layout_of_record` / `layout_of_columns`, asked first by trainer.data.chat):
- `preference`: prompt/chosen/rejected as text;
- `preference_chat`: chosen/rejected as message lists, the prompt explicit (`prompt`: messages or text) or implicit
  (the turns chosen and rejected share before their last one);
- `unpaired`: KTO's prompt/completion/label (label true/false).

`read_records` reads every record of a source (preference sets are small: thousands to a few hundred thousand
pairs) into the rows TRL's trainers take, and names each bad record by file and line (or record number in a
table): an empty or missing side, chosen equal to rejected, a label that is not a boolean, conversational sides
whose prompts differ, a layout that changes within a file. TRAIN_DATA_MAX_BAD_LINES skips and counts them.
Torch-free: the checks (stage 1) read the records before anything heavy is imported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.data.formats import file_kind, open_text, too_many_bad_lines

PAIRED = ("preference", "preference_chat")
PREFERENCE_LAYOUTS = {"preference": "prompt/chosen/rejected", "preference_chat": "conversational chosen/rejected",
                      "unpaired": "prompt/completion/label (KTO)"}  # fmt: skip
ROLES = ("system", "user", "assistant", "tool")


class NotJson(str):
    """A JSON Lines line that does not parse (what is wrong with it)."""


class BadPair(ValueError):
    """A record that cannot be trained on; the message says why (the caller adds file and line)."""


def layout_of_record(row: dict[str, Any]) -> str | None:
    """The preference layout of one JSON record; None for every other record."""
    if "chosen" in row and "rejected" in row:
        return "preference_chat" if any(isinstance(row[k], list) for k in ("chosen", "rejected")) else "preference"
    if "label" in row and "prompt" in row and "completion" in row:
        return "unpaired"
    return None


def layout_of_columns(schema: Any) -> str | None:
    """The preference layout of a table by its pyarrow schema; None for every other table."""
    import pyarrow as pa

    names = schema.names

    def is_list(name: str) -> bool:
        kind = schema.field(name).type
        return pa.types.is_list(kind) or pa.types.is_large_list(kind)

    if "chosen" in names and "rejected" in names:
        return "preference_chat" if is_list("chosen") or is_list("rejected") else "preference"
    if {"prompt", "completion", "label"} <= set(names):
        return "unpaired"
    return None


# ---- records ---------------------------------------------------------------------------------------------------


@dataclass
class PreferenceRecords:
    """Every usable record of a source, as TRL's trainers take them, with where each came from."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    wheres: list[str] = field(default_factory=list)
    layouts: list[str] = field(default_factory=list)  # each file's, in order
    skipped: list[str] = field(default_factory=list)  # bad records skipped under TRAIN_DATA_MAX_BAD_LINES
    problems: list[str] = field(default_factory=list)

    @property
    def paired(self) -> bool:
        return all(layout in PAIRED for layout in self.layouts)


def read_records(source: Any, max_bad_lines: int) -> PreferenceRecords:
    """Every record of `source` (a trainer.data.discovery.DataSource), checked; problems name file:line."""
    out = PreferenceRecords()
    bad: list[str] = []
    inputs = [source.saved_dataset] if source.saved_dataset else list(source.files)
    for path in inputs:
        file_layout: str | None = None
        for where, row in rows_of(Path(path)):
            layout = layout_of_record(row) if isinstance(row, dict) else None
            if isinstance(row, NotJson):
                bad.append(f"{where}: {row}")
                continue
            if layout is None:
                bad.append(f"{where}: not a preference record (fields: {fields_of(row)}); each needs chosen/rejected "
                           "(with a prompt) or prompt/completion/label")  # fmt: skip
                continue
            file_layout = file_layout or layout
            if layout != file_layout:
                bad.append(f"{where}: a {PREFERENCE_LAYOUTS[layout]} record in a file of "
                           f"{PREFERENCE_LAYOUTS[file_layout]} records; keep one layout per file")  # fmt: skip
                continue
            try:
                out.rows.append(normalized(row, layout))
            except BadPair as exc:
                bad.append(f"{where}: {exc}")
                continue
            out.wheres.append(where)
        if file_layout:
            out.layouts.append(file_layout)
    if len(bad) > max_bad_lines:
        out.problems.append(too_many_bad_lines(bad[0], len(bad), max_bad_lines, source.variable))
    else:
        out.skipped = bad
    if not out.problems and len({layout in PAIRED for layout in out.layouts}) > 1:
        out.problems.append(f"{source.variable}: its files mix preference pairs and unpaired prompt/completion/label "
                            "records; use one kind for a run")  # fmt: skip
    return out


def fields_of(row: Any) -> str:
    return ", ".join(sorted(row)[:8]) if isinstance(row, dict) else type(row).__name__


def rows_of(path: Path) -> Any:
    """(where, record) of every record: JSON Lines by line, a .json document, or a table by record number."""
    kind = file_kind(path) if path.is_file() else None
    if kind is not None and kind.format in ("jsonl", "json"):
        yield from _json_rows(path, kind.format)
        return
    import pyarrow as pa

    table = _table(path, kind.format if kind else "saved")
    for number, row in enumerate(table.to_pylist() if isinstance(table, pa.Table) else table, 1):
        yield f"{path}:record {number}", row


def _json_rows(path: Path, fmt: str) -> Any:
    with open_text(path) as handle:
        text = handle.read()
    if fmt == "json" and text.lstrip()[:1] in ("[", "{"):
        try:
            content = json.loads(text)
        except ValueError:
            content = None
        if content is not None:
            if isinstance(content, dict):
                lists = [v for v in content.values() if isinstance(v, list)]
                content = lists[0] if len(lists) == 1 and layout_of_record(content) is None else [content]
            for number, record in enumerate(content, 1):
                yield f"{path}:record {number}", record
            return
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row: Any = json.loads(line)
        except ValueError as exc:
            row = NotJson(f"not valid JSON ({exc})")
        yield f"{path}:{number}", row


def _table(path: Path, fmt: str) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if fmt == "parquet":
        return pq.read_table(path)
    files = sorted(path.rglob("*.arrow")) if path.is_dir() else [path]
    tables = []
    for one in files:
        with pa.memory_map(str(one)) as stream:
            try:
                tables.append(pa.ipc.open_stream(stream).read_all())
            except pa.ArrowInvalid:
                stream.seek(0)
                tables.append(pa.ipc.open_file(stream).read_all())
    return pa.concat_tables(tables) if tables else pa.table({})


# ---- one record -> TRL's row -----------------------------------------------------------------------------------


PAIR_SIDES = ("prompt", "chosen", "rejected")  # checked in this order: the first problem is the one named


def normalized(row: dict[str, Any], layout: str) -> dict[str, Any]:
    """The row TRL takes: {prompt, chosen, rejected} (text or messages) or {prompt, completion, label}."""
    if layout == "preference":
        pair = {side: _text(row.get(side), side, allow_empty=side == "prompt") for side in PAIR_SIDES}
        if pair["chosen"] == pair["rejected"]:
            raise BadPair("chosen equals rejected: the pair says nothing to learn; remove it or fix one side")
        return pair
    if layout == "preference_chat":
        return _chat_pair(row)
    label = row.get("label")
    if not isinstance(label, bool):
        raise BadPair(f"label must be true or false, not {json.dumps(label)}")
    prompt, completion = row.get("prompt"), row.get("completion")
    if isinstance(prompt, list) or isinstance(completion, list):
        return {"prompt": _prompt_messages(prompt), "completion": _answer(completion, "completion"), "label": label}
    return {"prompt": _text(prompt, "prompt", allow_empty=True), "completion": _text(completion, "completion"),
            "label": label}  # fmt: skip


def _text(value: Any, name: str, allow_empty: bool = False) -> str:
    if value is None:
        raise BadPair(f"no {name}")
    if not isinstance(value, str):
        raise BadPair(f"{name} must be text, not {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise BadPair(f"{name} is empty")
    return value


def _messages(items: Any, name: str) -> list[dict[str, Any]]:
    if not isinstance(items, list) or not items:
        raise BadPair(f"{name} must be a non-empty list of messages")
    out = []
    for n, item in enumerate(items, 1):
        if not isinstance(item, dict) or item.get("role") not in ROLES or not isinstance(item.get("content"), str):
            raise BadPair(f"{name}[{n}] must be an object with a role ({', '.join(ROLES)}) and its text in 'content'")
        out.append({"role": item["role"], "content": item["content"]})
    return out


def _prompt_messages(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": _text(value, "prompt")}]
    return _messages(value, "prompt")


def _answer(value: Any, name: str) -> list[dict[str, Any]]:
    """One side's answer: text (one assistant turn) or messages ending with a non-empty assistant turn."""
    messages = [{"role": "assistant", "content": value}] if isinstance(value, str) else _messages(value, name)
    if messages[-1]["role"] != "assistant":
        raise BadPair(f"{name} must end with an assistant turn (its last message has role {messages[-1]['role']})")
    if not messages[-1]["content"].strip():
        raise BadPair(f"{name}'s assistant turn is empty")
    return messages


def _chat_pair(row: dict[str, Any]) -> dict[str, Any]:
    chosen, rejected = _answer(row.get("chosen"), "chosen"), _answer(row.get("rejected"), "rejected")
    if row.get("prompt") is not None:
        prompt = _prompt_messages(row["prompt"])
        chosen, rejected = _after_prompt(prompt, chosen), _after_prompt(prompt, rejected)
    else:  # implicit: the turns both sides share before their last one
        if chosen[:-1] != rejected[:-1]:
            raise BadPair("chosen and rejected differ before their last turn, so their prompts differ; a pair "
                          "compares two answers to one prompt (give it as `prompt`, or make the earlier turns equal)")
        if len(chosen) < 2:
            raise BadPair("no prompt: give `prompt`, or begin chosen and rejected with the turns they answer")
        prompt, chosen, rejected = chosen[:-1], chosen[-1:], rejected[-1:]
    if chosen == rejected:
        raise BadPair("chosen equals rejected: the pair says nothing to learn; remove it or fix one side")
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


def _after_prompt(prompt: list[dict[str, Any]], side: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A side without the prompt's turns where it repeats them: the layout of the most used public preference sets
    (a text `prompt` and whole conversations in chosen/rejected), which would put the question twice in each side
    and the user turn inside the trained answer."""
    return side[len(prompt) :] if len(side) > len(prompt) and side[: len(prompt)] == prompt else side


def unpaired_from_pairs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """KTO on pairs: each pair is two examples, chosen labelled true and rejected false (counted by the caller)."""
    out = []
    for row in rows:
        out.append({"prompt": row["prompt"], "completion": row["chosen"], "label": True})
        out.append({"prompt": row["prompt"], "completion": row["rejected"], "label": False})
    return out


# ---- tokens (as TRL makes them: the prompt, then each side after it) ---------------------------------------------


def encode_side(tokenizer: Any, prompt: Any, answer: Any) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids) the way TRL 1.16 tokenizes a side: conversations through the chat template (the
    prompt with its generation prompt), text with the tokenizer's EOS after the answer; the answer is what the
    prompt+answer rendering adds after their common prefix."""
    if isinstance(prompt, list):
        ids = tokenizer.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True, return_dict=False)
        full = tokenizer.apply_chat_template(prompt + answer, tokenize=True, return_dict=False)
    else:
        eos = tokenizer.eos_token or ""
        answer = answer if not eos or answer.endswith(eos) else answer + eos
        ids = tokenizer(prompt)["input_ids"]
        full = tokenizer(prompt + answer)["input_ids"]
    ids, full = list(ids), list(full)
    shared = 0
    while shared < min(len(ids), len(full)) and ids[shared] == full[shared]:
        shared += 1
    return full[:shared], full[shared:]


def encoded(tokenizer: Any, row: dict[str, Any]) -> dict[str, Any]:
    """{prompt_ids, chosen_ids, rejected_ids} of a pair, or {prompt_ids, completion_ids, label} of a KTO row."""
    if "label" in row:
        prompt_ids, completion_ids = encode_side(tokenizer, row["prompt"], row["completion"])
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "label": row["label"]}
    prompt_ids, chosen_ids = encode_side(tokenizer, row["prompt"], row["chosen"])
    prompt_rejected, rejected_ids = encode_side(tokenizer, row["prompt"], row["rejected"])
    shared = min(len(prompt_ids), len(prompt_rejected))
    return {"prompt_ids": prompt_ids[:shared], "chosen_ids": prompt_ids[shared:] + chosen_ids,
            "rejected_ids": prompt_rejected[shared:] + rejected_ids}  # fmt: skip


def longest(item: dict[str, Any]) -> int:
    """Tokens of the longest side with its prompt."""
    sides = [len(item[k]) for k in ("chosen_ids", "rejected_ids", "completion_ids") if k in item]
    return len(item["prompt_ids"]) + max(sides)


# ---- TRAIN_PREF_MAX_PROMPT_LEN: the prompt cut from the left, one cut for both sides ---------------------------


def prompt_tokens(tokenizer: Any, prompt: Any) -> int:
    """Tokens of the prompt alone as TRL renders it (conversations with their generation prompt); the prompt TRL
    trains against is at most this long."""
    if isinstance(prompt, list):
        return len(tokenizer.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True,
                                                 return_dict=False))  # fmt: skip
    return len(tokenizer(prompt)["input_ids"])


def cut_prompt(tokenizer: Any, prompt: Any, limit: int) -> Any:
    """The prompt cut from the left to at most `limit` tokens: text loses its start; a conversation its earliest
    messages (a system message too), then the start of the earliest one kept, and any assistant or tool turn left
    first. None if even the shortest cut does not fit (the chat template's own tokens alone are longer). The cut is
    on the prompt, so both sides share it."""
    if prompt_tokens(tokenizer, prompt) <= limit:
        return prompt
    if isinstance(prompt, str):
        return _tail_that_fits(lambda start: prompt[start:], len(prompt), tokenizer, limit)
    kept = next((k for k in range(1, len(prompt)) if prompt_tokens(tokenizer, prompt[k:]) <= limit), len(prompt))
    first, rest = prompt[kept - 1], prompt[kept:]  # the earliest message kept, in part

    def with_tail(start: int) -> list[dict[str, Any]]:
        return [{**first, "content": first["content"][start:]}, *rest]

    cut = _tail_that_fits(with_tail, len(first["content"]), tokenizer, limit)
    if cut is None or not cut[0]["content"].strip():
        cut = rest if rest and prompt_tokens(tokenizer, rest) <= limit else cut
    while cut and cut[0]["role"] not in ("system", "user"):  # no answer without its question (and templates that
        cut = cut[1:]  # insist on alternation accept what is left)
    return cut or None


def _tail_that_fits(cut_at: Any, size: int, tokenizer: Any, limit: int) -> Any:
    """cut_at(start) for the smallest start (characters dropped) whose prompt fits `limit`; None if none does.
    Binary search: fewer characters never make more tokens, give or take a merge at the cut, checked after."""
    if prompt_tokens(tokenizer, cut_at(size)) > limit:
        return None
    low, high = 0, size  # cut_at(low) is too long, cut_at(high) fits
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if prompt_tokens(tokenizer, cut_at(middle)) <= limit else (middle, high)
    return cut_at(high)


@dataclass
class PromptLimit:
    """What TRAIN_PREF_MAX_PROMPT_LEN did to a set of rows (logged by the run, shown by `data --show`)."""

    rows: list[dict[str, Any]]
    cut: int = 0  # prompts cut from the left (TRAIN_LONG_RECORDS=truncate)
    dropped: int = 0  # records dropped: TRAIN_LONG_RECORDS=drop, or a prompt no cut makes fit


def limit_prompts(rows: list[dict[str, Any]], tokenizer: Any, limit: int, long_records: str) -> PromptLimit:
    """Rows whose prompt is at most `limit` tokens (0: no limit): longer prompts cut from the left (truncate) or
    their records dropped (drop), each counted."""
    if limit <= 0:
        return PromptLimit(list(rows))
    out = PromptLimit([])
    for row in rows:
        prompt = row["prompt"] if prompt_tokens(tokenizer, row["prompt"]) <= limit else None
        if prompt is None and long_records == "truncate":
            prompt = cut_prompt(tokenizer, row["prompt"], limit)
            out.cut += prompt is not None
        if prompt is None:
            out.dropped += 1
            continue
        out.rows.append({**row, "prompt": prompt})
    return out
