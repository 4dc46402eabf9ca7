"""Prompts for online RL (TRAIN_METHOD=grpo/rloo): the records the model answers in training, read whole and checked
before torch, every other column kept for the reward functions.

A record is a prompt as text (`prompt`: "..."), as a message list (`prompt`: [...]) or a conversation whose last turn
is the user's (`messages`: [..., {"role": "user", ...}]); the prompt becomes TRL's `prompt` (text, or messages that
TRL renders with the chat template and its generation prompt), and every other field of the record (`answer`,
`solution`, `tests`, ...) reaches the reward functions unchanged. A record with no prompt, an empty one, or one
ending on an assistant turn is named by file and line; TRAIN_DATA_MAX_BAD_LINES skips and counts them. Torch-free.
A mix of sources (TRAIN_DATA=SOURCE:WEIGHT,... or a mix file, trainer.data.mix's rule) is read source by source;
trainer.data.mixed draws it, a weight being a share of the prompts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.data.formats import too_many_bad_lines
from trainer.data.mix import Mix
from trainer.data.preference import ROLES, NotJson, fields_of, rows_of

PROMPT_LAYOUTS = ("prompt", "messages")  # the layouts (trainer.data.chat's names) a prompts file may have
WHERE = "trainkit_record"  # the column naming each row's file:line; the reward wrapper takes it off again


class BadPrompt(ValueError):
    """A record that gives no prompt; the message says why (the caller adds file and line)."""


@dataclass
class PromptRecords:
    """Every usable prompt record of a source, as TRL's online trainers take them, with where each came from."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    wheres: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # bad records skipped under TRAIN_DATA_MAX_BAD_LINES
    problems: list[str] = field(default_factory=list)
    parts: list[int] = field(default_factory=list)  # a mix: how many rows each source gave, in TRAIN_DATA's order

    @property
    def chat(self) -> bool:
        return any(isinstance(row["prompt"], list) for row in self.rows[:1])


def read_prompts(source: Any, max_bad_lines: int) -> PromptRecords:
    """Every record of `source` (a trainer.data.discovery.DataSource), checked; problems name file:line."""
    out = PromptRecords()
    bad: list[str] = []
    inputs = [source.saved_dataset] if source.saved_dataset else list(source.files)
    for path in inputs:
        for where, row in rows_of(Path(path)):
            try:
                out.rows.append(prompt_row(row))
            except BadPrompt as exc:
                bad.append(f"{where}: {exc}")
                continue
            out.wheres.append(where)
    if len(bad) > max_bad_lines:
        out.problems.append(too_many_bad_lines(bad[0], len(bad), max_bad_lines, source.variable))
    else:
        out.skipped = bad
    return _one_kind(out, source.variable)


def read_prompt_mix(mix: Mix, parts: list[Any], max_bad_lines: int) -> PromptRecords:
    """A mix's prompts (trainer.data.mix): each source read as read_prompts reads it, at most its `max_records`,
    one after another; `parts` counts each source's rows (trainer.data.mixed.training_prompts draws the mix)."""
    out = PromptRecords()
    for entry, source in zip(mix.entries, parts, strict=True):
        got = read_prompts(source, max_bad_lines)
        kept = len(got.rows) if entry.max_records is None else min(len(got.rows), entry.max_records)
        out.rows += got.rows[:kept]
        out.wheres += got.wheres[:kept]
        out.skipped += got.skipped
        out.problems += got.problems
        out.parts.append(kept)
    return _one_kind(out, "TRAIN_DATA")


def _one_kind(out: PromptRecords, variable: str) -> PromptRecords:
    kinds = {isinstance(row["prompt"], list) for row in out.rows}
    if not out.problems and len(kinds) > 1:
        out.problems.append(f"{variable}: some prompts are text and some are messages; use one kind for a run "
                            "(TRL renders a batch one way)")  # fmt: skip
    return out


def prompt_row(row: Any) -> dict[str, Any]:
    """TRL's row of one record: `prompt` (text or messages ending on a user turn) and every other field as it is."""
    if isinstance(row, NotJson):
        raise BadPrompt(str(row))
    if not isinstance(row, dict):
        raise BadPrompt(f"a record must be an object with a prompt, not {type(row).__name__}")
    if "chosen" in row or "rejected" in row or "completion" in row:
        raise BadPrompt(
            f"a record with answers (fields: {fields_of(row)}) is SFT or preference data; online RL "
            "generates the answers: give prompts (`prompt`, or `messages` ending on a user turn)"
        )
    if "prompt" in row:
        prompt = row["prompt"]
        rest = {k: v for k, v in row.items() if k != "prompt"}
    elif "messages" in row:
        prompt = row["messages"]
        rest = {k: v for k, v in row.items() if k != "messages"}
    else:
        raise BadPrompt(f"no prompt (fields: {fields_of(row)}); each record needs `prompt` (text or messages) or "
                        "`messages` ending on a user turn")  # fmt: skip
    if WHERE in rest:
        raise BadPrompt(f"the field {WHERE!r} is trainkit's own (each record's file:line); rename it")
    return {"prompt": _prompt(prompt), **rest}


def _prompt(value: Any) -> Any:
    if isinstance(value, str):
        if not value.strip():
            raise BadPrompt("the prompt is empty")
        return value
    if not isinstance(value, list) or not value:
        raise BadPrompt(f"the prompt must be text or a non-empty list of messages, not {type(value).__name__}")
    messages = []
    for n, item in enumerate(value, 1):
        if not isinstance(item, dict) or item.get("role") not in ROLES or not isinstance(item.get("content"), str):
            raise BadPrompt(f"message {n} must be an object with a role ({', '.join(ROLES)}) and its text in "
                            "'content'")  # fmt: skip
        if item["role"] == "user" and not item["content"].strip():
            raise BadPrompt(f"message {n}, the user's turn, is empty; a prompt asks the model something")
        messages.append({"role": item["role"], "content": item["content"]})
    if messages[-1]["role"] != "user":
        raise BadPrompt(f"the conversation ends on a {messages[-1]['role']} turn; a prompt ends on the user's turn "
                        "the model answers")  # fmt: skip
    return messages


def rendered(tokenizer: Any, prompt: Any, tools: list[Any] | None = None) -> str:
    """The text the model is given: a conversation through the chat template with its generation prompt (and the
    `tools` it may call described, as TRL renders them)."""
    if isinstance(prompt, list):
        return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True, tools=tools or None)
    return prompt
