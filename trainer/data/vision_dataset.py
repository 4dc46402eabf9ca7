"""The dataset of records with images the Trainer reads, and the collator that makes its batches.

Every record is read (images decoded and hashed: trainer.data.vision) and encoded once when the run starts
(`prepare_images`: its ids, trained tokens and image spans, within TRAIN_SEQ_LEN by TRAIN_LONG_RECORDS), so every
refusal comes before the model loads. A record is one sequence: records with images are never packed. A batch is
made by the processor from the records' rendered texts and their images (decoded again in the DataLoader), padded
on the right to its longest record; its ids must equal those encoded at the start (a changed image or processor
would break the masks: that is an error, never a silent mismatch), and its labels are the ids on the trained
tokens only.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from trainer.data.chat import BadRecord
from trainer.data.images import read_image
from trainer.data.vision import ImageRecords, report_bad
from trainer.data.vision_encode import IGNORE_INDEX, TEXT_KEYS, Encoded, ImageEncoder, LongRecord, fit_to_length
from trainer.data.vision_encode import long_records_error as too_long

log = logging.getLogger("trainer")


class ImageDataset:
    """Records with images, one per item; `encoded[i]` is record i's tokens as the start of the run made them."""

    def __init__(self, read: ImageRecords, encoded: list[Encoded], encoder: ImageEncoder, seq_len: int,
                 dropped: int = 0) -> None:  # fmt: skip
        self.records, self.encoded, self.encoder, self.dropped = read.records, encoded, encoder, dropped
        self.read, self.seq_len = read, seq_len
        kept = sum(e.kept for e in encoded)
        # tokens_per_s in metrics.jsonl counts each record's own tokens (trainer.run.metrics.useful_token_share)
        self.meta = {"seq_len": seq_len, "packing": {"record_blocks": len(encoded), "stream_blocks": 0,
                                                     "padding_tokens": len(encoded) * seq_len - kept}}  # fmt: skip

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not 0 <= i < len(self):
            raise IndexError(i)
        return {"record": self.records[i], "encoded": self.encoded[i], "encoder": self.encoder}

    def subset(self, start: int, stop: int) -> ImageDataset:
        part = ImageRecords(self.read.records[start:stop], [], self.read.layouts)
        return ImageDataset(part, self.encoded[start:stop], self.encoder, self.seq_len)

    def image_tokens(self) -> list[int]:
        return [e.image_tokens for e in self.encoded]


def prepare_images(read: ImageRecords, encoder: ImageEncoder, seq_len: int, long_records: str, max_bad: int,
                   variable: str = "TRAIN_DATA") -> ImageDataset:  # fmt: skip
    """Every record encoded and fitted to TRAIN_SEQ_LEN; records the template or processor refuses are bad records
    (TRAIN_DATA_MAX_BAD_LINES), records too long follow TRAIN_LONG_RECORDS (dropped and counted, or refused
    by file and line where truncation would cut an image)."""
    records, encoded, bad, refused, dropped = [], [], [], [], 0
    for record in read.records:
        try:
            fitted = fit_to_length(encoder.encode(record), seq_len, long_records, record.where)
        except BadRecord as exc:
            bad.append(f"{record.where}: {exc}")
            continue
        except LongRecord as exc:
            refused.append(str(exc))
            continue
        if fitted is None:
            dropped += 1
            continue
        records.append(record)
        encoded.append(fitted)
    report_bad(bad, max(0, max_bad - len(read.bad)), variable)
    if refused:
        raise too_long(refused, seq_len)
    if dropped:
        log.warning("data: %d record(s) with images longer than TRAIN_SEQ_LEN=%d dropped (TRAIN_LONG_RECORDS=drop)",
                    dropped, seq_len)  # fmt: skip
    if not records:
        from trainer.errors import ConfigError

        raise ConfigError(f"{variable}: no record with images is left to train on ({dropped} too long, "
                          f"{len(bad) + len(read.bad)} bad)")  # fmt: skip
    return ImageDataset(ImageRecords(records, read.bad + bad, read.layouts), encoded, encoder, seq_len, dropped)


def serial_tokenizer_in_workers() -> None:
    """In a DataLoader worker, the Rust tokenizer encodes on one thread: the run turned its parallelism on
    (TOKENIZERS_PARALLELISM=true), which tokenizers then keeps on in a forked child, whose thread pool is the
    parent's, not running: its first batch would wait forever."""
    import os

    from torch.utils.data import get_worker_info

    if get_worker_info() is not None:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"


class ImageCollator:
    """Batches of records with images (items of ImageDataset, training's or evaluation's): the processor's tensors,
    right padded, and the labels."""

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        serial_tokenizer_in_workers()
        records = [item["record"] for item in items]
        encoded = [item["encoded"] for item in items]
        encoder = items[0]["encoder"]
        texts = [encoder.render(r.conversation.messages) for r in records]
        images = [[read_image(ref)[0] for ref in r.images] for r in records]
        batch = dict(encoder.process(texts, images, return_tensors="pt"))
        for key in ("offset_mapping", "text_replacement_offsets"):
            batch.pop(key, None)
        ids = batch["input_ids"]
        labels = torch.full_like(ids, IGNORE_INDEX)
        pad = encoder.tokenizer.pad_token_id
        for row, (record, enc) in enumerate(zip(records, encoded, strict=True)):
            made, tail = ids[row, : len(enc.ids)].numpy(), batch["attention_mask"][row, len(enc.ids) :]
            if not np.array_equal(made, enc.ids) or bool(tail.any()):
                raise RuntimeError(f"{record.where}: the processor made other tokens than when the run started (an "
                                   "image or the processor changed during the run)")  # fmt: skip
            kept = enc.kept
            labels[row, :kept] = torch.from_numpy(np.where(enc.trained[:kept] != 0, enc.ids[:kept], IGNORE_INDEX))
            if kept < len(enc.ids):  # TRAIN_LONG_RECORDS=truncate: text after the last image, cut
                ids[row, kept:] = pad
                batch["attention_mask"][row, kept:] = 0
        width = max(e.kept for e in encoded)
        for key in TEXT_KEYS:
            if key in batch:
                batch[key] = batch[key][:, :width]
        batch["labels"] = labels[:, :width]
        return batch
