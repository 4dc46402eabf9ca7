"""`DataSpec`: what shapes the packed data, the one value the data layer is given instead of the settings.

Every field whose metadata does not say `key=False` is part of the cache key (trainer.data.cache.cache_key), so a
new field that changes the tokens (a preference layout, a new rule) changes the key by being declared here. Fields
marked `key=False` change how the data is made or checked, never what it holds.
The configuration builds it from TRAIN_* (trainer.config.inputs); tests and benchmarks build it directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

PackingMode = Literal["auto", "stream", "records"]
LongRecords = Literal["truncate", "drop"]
LossOn = Literal["assistant", "last", "all"]
MASKED_LAYOUTS = ("pair", "messages", "conversations", "chat_pair")  # layouts whose records carry a loss mask


def _not_key(default: Any) -> Any:
    return field(default=default, metadata={"key": False})


@dataclass(frozen=True)
class DataSpec:
    """TRAIN_SEQ_LEN, TRAIN_TEXT_FIELD, TRAIN_PACKING, TRAIN_LONG_RECORDS, TRAIN_LOSS_ON and the limits of making it.

    The chat template is the tokenizer's (TRAIN_CHAT_TEMPLATE set on it); the cache key takes its hash from there."""

    seq_len: int
    text_field: str = "text"
    packing: PackingMode = "auto"
    long_records: LongRecords = "truncate"
    loss_on: LossOn = "assistant"
    max_bad_lines: int = _not_key(0)  # TRAIN_DATA_MAX_BAD_LINES: malformed records skipped before the run stops
    workers: int | None = _not_key(None)  # tokenizer processes (0: this one); None: chosen by corpus size and cores
    max_records: int | None = None  # a mix source's cap (trainer.data.mix): its first N records; keyed when set

    def key(self) -> dict[str, Any]:
        """The fields that shape the tokens: this spec's part of the cache key (max_records only when set, so a
        source without a cap keeps the key it always had)."""
        key = {f.name: getattr(self, f.name) for f in fields(self) if f.metadata.get("key", True)}
        if key["max_records"] is None:
            del key["max_records"]
        return key

    def records_for(self, has_mask: bool) -> bool:
        """Whether a piece's records keep their boundaries (auto: pieces with a loss mask, i.e. not plain text)."""
        return self.packing == "records" or (self.packing == "auto" and has_mask)

    def packing_meta(self) -> dict[str, str]:
        """meta.json's `packing` settings."""
        return {"packing": self.packing, "long_records": self.long_records}

    def packing_of(self, layouts: tuple[str, ...]) -> tuple[str, str]:
        """(how the data is packed, why) for data of these record layouts: the `packing` decision."""
        if any(layout.startswith("image_") for layout in layouts):  # trainer.data.vision's layouts
            longer = ("dropped and counted" if self.long_records == "drop" else "cut after its last image, or refused "
                      "by file:line where that cut is not possible")  # fmt: skip
            return "records", ("records with images: one record per sequence, padded to the longest in its batch, "
                               f"never packed; longer than TRAIN_SEQ_LEN: {longer} (TRAIN_LONG_RECORDS="
                               f"{self.long_records})")  # fmt: skip
        masked = [layout for layout in layouts if layout in MASKED_LAYOUTS]
        plain = len(masked) < len(layouts) or not layouts
        records = f"records whole per sequence, padded (longer than TRAIN_SEQ_LEN={self.seq_len}: " + (
            "dropped, TRAIN_LONG_RECORDS=drop)" if self.long_records == "drop" else "truncated, TRAIN_LONG_RECORDS)")
        if self.packing != "auto":
            how = records if self.packing == "records" else "one stream cut into sequences (records may span two)"
            return self.packing, f"set by TRAIN_PACKING: {how}"
        if not masked:
            return "stream", "auto: plain text, one stream cut into sequences (records may span two)"
        if not plain:
            return "records", f"auto: prompt/completion or conversation data: {records}"
        return "records+stream", (f"auto: records with a loss mask: {records}; the plain text as one stream, its "
                                  "tail packed with the records")  # fmt: skip
