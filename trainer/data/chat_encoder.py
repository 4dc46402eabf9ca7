"""Conversations as token ids and loss masks through the tokenizer's chat template (trainer.data.chat says which
layouts, roles and turns; TRAIN_LOSS_ON which turns are trained)."""

from __future__ import annotations

import functools
import itertools
from typing import TYPE_CHECKING, Any

from trainer.data.chat import (
    GENERATION_TAG,
    BadRecord,
    Conversation,
    assistant_spans,
    check_trainable,
    in_file_order,
    no_template_problem,
)
from trainer.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np


class ChatEncoder:
    """Token ids and loss masks of conversations through the tokenizer's chat template."""

    def __init__(self, tokenizer: Any, loss_on: str, dtype: str) -> None:
        self.tokenizer, self.loss_on, self.dtype = tokenizer, loss_on, dtype
        template = getattr(tokenizer, "chat_template", None)
        if isinstance(template, dict):
            template = template.get("default") or next(iter(template.values()))
        self.template = template
        self.has_generation_tags = bool(template and GENERATION_TAG.search(template))

    def encode(self, conv: Conversation) -> tuple[np.ndarray, np.ndarray]:
        """(ids, mask) of one conversation; BadRecord when the template raises or cannot be split by turns."""
        import numpy as np

        if self.template is None:
            raise ConfigError(no_template_problem("conversations", "the tokenizer has none"))
        check_trainable(conv, self.loss_on)
        try:
            if self.loss_on == "all":
                ids = self._render(conv.messages, tokenize=True, tools=conv.tools)
                return np.asarray(ids, self.dtype), np.ones(len(ids), np.uint8)
            if self.has_generation_tags and conv.first_trained == 0 and self.loss_on == "assistant":
                return self._by_generation_tags(conv)
            render = functools.partial(self._render, tools=conv.tools)
            return self._tokens_with_spans(*assistant_spans(render, conv, self.loss_on))
        except BadRecord:
            raise
        except Exception as exc:  # a template's raise_exception(), a Jinja error, a missing variable
            raise BadRecord(f"the chat template raised {type(exc).__name__}: {exc}") from None

    def encode_all(self, conversations: list[Conversation], bad: list[str]
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:  # fmt: skip
        """(ids, mask, record lengths, bad lines in file order) of a unit's conversations, each whole; a record
        the template refuses is a bad line, named by file and line."""
        import numpy as np

        ids, mask, lengths, bad = [], [], [], list(bad)
        for conv in conversations:
            try:
                record_ids, record_mask = self.encode(conv)
            except BadRecord as exc:
                bad.append(f"{conv.where}: {exc}")
                continue
            ids.append(record_ids)
            mask.append(record_mask)
            lengths.append(len(record_ids))
        if not ids:
            ids, mask = [np.zeros(0, self.dtype)], [np.zeros(0, np.uint8)]
        return np.concatenate(ids), np.concatenate(mask), np.asarray(lengths, np.int64), in_file_order(bad)

    def _render(self, messages: list[dict[str, Any]], tokenize: bool = False, **kwargs: Any) -> Any:
        return self.tokenizer.apply_chat_template(messages, chat_template=self.template, tokenize=tokenize,
                                                  return_dict=False, **kwargs)  # fmt: skip

    def _by_generation_tags(self, conv: Conversation) -> tuple[np.ndarray, np.ndarray]:
        import numpy as np

        out = self.tokenizer.apply_chat_template(conv.messages, chat_template=self.template, tokenize=True,
                                                 return_dict=True, return_assistant_tokens_mask=True,
                                                 tools=conv.tools)  # fmt: skip
        return np.asarray(out["input_ids"], self.dtype), np.asarray(out["assistant_masks"], np.uint8)

    def _tokens_with_spans(self, text: str, spans: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
        """The text's tokens as `apply_chat_template` makes them (no added special tokens: the template has them);
        a token is trained when its characters overlap a span."""
        import numpy as np

        if not self.tokenizer.is_fast:  # no character offsets: tokenize piece by piece at the span edges
            return self._pieces(text, spans)
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        mask = np.zeros(len(enc["input_ids"]), np.uint8)
        for t, (s, e) in enumerate(enc["offset_mapping"]):
            if any(s < end and e > start for start, end in spans):
                mask[t] = 1
        return np.asarray(enc["input_ids"], self.dtype), mask

    def _pieces(self, text: str, spans: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
        import numpy as np

        edges = sorted({0, len(text), *(x for span in spans for x in span)})
        ids: list[int] = []
        mask: list[int] = []
        for a, b in itertools.pairwise(edges):
            part = self.tokenizer(text[a:b], add_special_tokens=False)["input_ids"]
            ids += part
            mask += [int(any(a >= s and b <= e for s, e in spans))] * len(part)
        return np.asarray(ids, self.dtype), np.asarray(mask, np.uint8)
