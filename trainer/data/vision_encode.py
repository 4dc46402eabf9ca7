"""Records with images as the model reads them: through the model's processor, the loss on the assistant turns only.

The trained tokens are found without the template's `{% generation %}` markers, for every family alike: the
characters of each trained turn come from rendering prefixes (trainer.data.chat.assistant_spans, as for text), and
the processor's own record of where it expanded each image placeholder (`text_replacement_offsets`) moves them onto
the expanded text, whose tokens carry their character offsets. Every token of an expanded image (and any token the
processor types as multimodal) carries no loss. A record longer than TRAIN_SEQ_LEN is never cut through an image:
TRAIN_LONG_RECORDS=drop drops and counts it; truncate cuts it only after its last image, with trained tokens left,
and refuses it, by file and line, where that is not possible.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainer.data.chat import BadRecord, assistant_spans
from trainer.data.images import read_image
from trainer.data.vision import ImageRecord
from trainer.errors import ConfigError

log = logging.getLogger("trainer")

IGNORE_INDEX = -100
TEXT_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids")  # [batch, tokens] outputs
DROPPED_KEYS = ("offset_mapping", "text_replacement_offsets")
PROBE_IMAGE_SIDE = 32


@dataclass
class Encoded:
    """One record's tokens as the processor makes them: ids, the trained-token mask, the token spans of its images,
    and how many tokens are kept (fewer than the ids where TRAIN_LONG_RECORDS=truncate cut text after the last
    image)."""

    ids: np.ndarray
    trained: np.ndarray
    image_spans: list[tuple[int, int]]
    kept: int

    @property
    def image_tokens(self) -> int:
        return sum(end - start for start, end in self.image_spans)


class ImageEncoder:
    """Records -> processor inputs and labels, for one processor and chat template."""

    def __init__(self, processor: Any, template: str, loss_on: str) -> None:
        self.processor, self.template, self.loss_on = processor, template, loss_on
        self.tokenizer = getattr(processor, "tokenizer", processor)

    def render(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        return self.tokenizer.apply_chat_template(messages, chat_template=self.template, tokenize=False, **kwargs)

    def process(self, texts: list[str], images: list[list[Any]], **kwargs: Any) -> Any:
        """The processor's outputs for a batch of rendered texts and their images (right padded)."""
        pictures = images if any(images) else None
        return self.processor(text=texts, images=pictures, padding=True, padding_side="right", **kwargs)

    def encode(self, record: ImageRecord) -> Encoded:
        """A record's ids and trained tokens; BadRecord when its template or processor cannot render it."""
        images = [read_image(ref)[0] for ref in record.images]
        try:
            text, spans = self._spans(record)
            out = self.process([text], [images], return_offsets_mapping=True, return_text_replacement_offsets=True,
                               return_mm_token_type_ids=True)  # fmt: skip
        except BadRecord:
            raise
        except Exception as exc:  # a template's raise_exception(), a processor's refusal of the record
            raise BadRecord(f"the chat template or processor refused it ({type(exc).__name__}: {exc})") from None
        ids = np.asarray(out["input_ids"][0], np.int64)
        offsets = [tuple(o) for o in out["offset_mapping"][0]]
        replaced = [tuple(r["new_span"]) for r in (out.get("text_replacement_offsets") or [[]])[0]]
        shifted = [_shift(span, out.get("text_replacement_offsets") or [[]]) for span in spans]
        trained = np.array([any(s < e2 and e > s2 for s2, e2 in shifted) for s, e in offsets], np.uint8)
        image_spans = [_token_span(offsets, span) for span in replaced]
        for start, end in image_spans:
            trained[start:end] = 0
        for key in ("mm_token_type_ids", "token_type_ids"):
            if key in out:
                trained[np.asarray(out[key][0]) != 0] = 0
        return Encoded(ids, trained, image_spans, len(ids))

    def _spans(self, record: ImageRecord) -> tuple[str, list[tuple[int, int]]]:
        conv = record.conversation
        if self.loss_on == "all":
            text = self.render(conv.messages)
            return text, [(0, len(text))]
        return assistant_spans(self.render, conv, self.loss_on)


def _shift(span: tuple[int, int], replacements: list[list[dict[str, Any]]]) -> tuple[int, int]:
    """A character span of the rendered text moved onto the expanded text (each placeholder before it grew)."""
    def moved(char: int) -> int:
        gained = 0
        for r in replacements[0]:
            if r["span"][1] <= char:
                gained += (r["new_span"][1] - r["new_span"][0]) - (r["span"][1] - r["span"][0])
        return char + gained

    return moved(span[0]), moved(span[1])


def _token_span(offsets: list[tuple[int, int]], chars: tuple[int, int]) -> tuple[int, int]:
    """The tokens [start, end) overlapping a character span (an expanded image)."""
    inside = [t for t, (s, e) in enumerate(offsets) if s < chars[1] and e > chars[0]]
    return (inside[0], inside[-1] + 1) if inside else (0, 0)


def fit_to_length(encoded: Encoded, seq_len: int, long_records: str, where: str) -> Encoded | None:
    """The record within TRAIN_SEQ_LEN: as it is; None to drop it (TRAIN_LONG_RECORDS=drop); cut after its last
    image (truncate). BadRecord where a cut would go through an image or leave nothing trained."""
    if len(encoded.ids) <= seq_len:
        return encoded
    if long_records == "drop":
        return None
    last_image = max((end for _, end in encoded.image_spans), default=0)
    if last_image > seq_len or not encoded.trained[:seq_len].any():
        what = "through an image" if last_image > seq_len else "before its trained tokens"
        raise LongRecord(f"{where}: {len(encoded.ids)} tokens ({encoded.image_tokens} of them image tokens) is "
                         f"longer than TRAIN_SEQ_LEN={seq_len}, and TRAIN_LONG_RECORDS=truncate would cut it {what}")
    encoded.kept = seq_len
    encoded.trained = encoded.trained.copy()
    encoded.trained[seq_len:] = 0
    return encoded


class LongRecord(Exception):
    """A record TRAIN_LONG_RECORDS=truncate cannot cut (the message names it by file and line)."""


def long_records_error(refused: list[str], seq_len: int) -> ConfigError:
    shown = "; ".join(refused[:5]) + (f"; and {len(refused) - 5} more" if len(refused) > 5 else "")
    return ConfigError(
        f"TRAIN_DATA: {len(refused)} record(s) with images cannot be cut to TRAIN_SEQ_LEN={seq_len} without cutting "
        f"an image or every trained token: {shown}; raise TRAIN_SEQ_LEN, shorten them, or set TRAIN_LONG_RECORDS=drop "
        "to drop (and count) them"
    )


def template_shows_images(encoder: ImageEncoder) -> bool:
    """Whether the chat template renders an image part as the processor's image placeholder (exactly once)."""
    token = getattr(encoder.processor, "image_token", None)
    if not token:
        return False
    probe = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "?"}]},
             {"role": "assistant", "content": [{"type": "text", "text": "!"}]}]  # fmt: skip
    try:
        return encoder.render(probe).count(token) == 1
    except Exception:  # a template that refuses list content
        return False


def probe_image() -> Any:
    from PIL import Image

    return Image.new("RGB", (PROBE_IMAGE_SIDE, PROBE_IMAGE_SIDE), (128, 128, 128))
