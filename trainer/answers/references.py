"""The eval set's questions and reference answers, read by the data layer's own readers (the layouts training
takes): a prompt/completion record asks its prompt as plain text; a conversation asks everything before its last
trained assistant turn, through the chat template, and that turn is the reference. Text records have no reference
(they count for the loss only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainer.answers.decoding import Prompt


@dataclass
class Reference:
    where: str  # file:line (or file:record N)
    prompt: Prompt
    reference: str

    def shown(self) -> dict[str, Any]:
        """The question as the per-record results show it."""
        if self.prompt.messages is not None:
            return {"messages": self.prompt.messages}
        return {"prompt": self.prompt.text}


def references(source: Any, text_field: str, loss_on: str) -> tuple[list[Reference], int]:
    """(references in file order, records without one: text, or no assistant turn to ask for)."""
    from trainer.data.readers import LineChunk, iter_units, parse_chunk

    found: list[Reference] = []
    without = 0
    for unit in iter_units(source, text_field):
        columns = parse_chunk(unit, text_field) if isinstance(unit, LineChunk) else unit
        if columns.conversations is not None:
            for conv in columns.conversations:
                reference = _of_conversation(conv, loss_on)
                without += reference is None
                found += [reference] if reference else []
        elif columns.prompts is not None:
            pairs = zip(columns.prompts.to_pylist(), columns.completions.to_pylist(), strict=True)
            for n, (prompt, completion) in enumerate(pairs, 1):
                text = prompt.decode("utf-8", "replace") if isinstance(prompt, bytes) else prompt
                answer = completion.decode("utf-8", "replace") if isinstance(completion, bytes) else completion
                found.append(Reference(f"{columns.origin}:record {n}", Prompt(text=text), answer))
        else:
            without += columns.records
    return found, without


def _of_conversation(conv: Any, loss_on: str) -> Reference | None:
    from trainer.data.chat import trained_turns

    turns = trained_turns(conv, "last" if loss_on == "all" else loss_on)
    if not turns:
        return None
    last = turns[-1]
    return Reference(conv.where, Prompt(messages=conv.messages[:last]), conv.messages[last]["content"] or "")
