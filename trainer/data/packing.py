"""Packing token pieces into `seq_len` sequences: record boundaries kept (best fit), or one stream cut into windows.

TRAIN_PACKING picks how: `records` puts whole records into sequences (a record is never split: one longer than
`seq_len` is truncated or dropped, per TRAIN_LONG_RECORDS) and pads what is left; `stream` concatenates everything
and cuts it into windows (pretraining-style: a record may span two sequences); `auto` packs records for
prompt/completion and conversation data (pieces with a loss mask) and streams plain text.

Records mode writes, next to the tokens, one flags byte per token (the shard's mask file): FLAG_TRAINED where the
loss is taken, FLAG_START on the first token of each record (and of the padding run, its own segment). The dataset
turns the flags into `position_ids` restarting at 0 on each record and labels -100 on record starts, untrained
tokens and padding. Stream blocks in the same shards carry only FLAG_TRAINED/0 (no restart).

The best-fit packer holds at most `open_bins` unfinished sequences (at most PACK_WINDOW_TOKENS tokens) and as many
records waiting to be placed, so its memory does not grow with the corpus. Each window of records is placed longest
first, each into the open sequence with the least room that still fits it (best fit decreasing); when too many
sequences are open, the fullest is written.
Everything here is numpy; nothing imports torch.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainer.data.spec import DataSpec

log = logging.getLogger("trainer")

FLAG_TRAINED = 1
FLAG_START = 2
PACK_WINDOW_TOKENS = 1 << 22  # unfinished sequences the best-fit packer keeps open, in tokens
MIN_OPEN_BINS, MAX_OPEN_BINS = 16, 1024


@dataclass
class PackStats:
    """What packing did, for meta.json and the log."""

    records_packed: int = 0
    records_truncated: int = 0
    records_dropped_too_long: int = 0
    records_dropped_untrained: int = 0
    records_cut_untrained: int = 0  # of those: truncation (TRAIN_LONG_RECORDS=truncate) cut off every trained token
    first_trained_at: int = -1  # the earliest token a dropped record trains on (where its first answer starts)
    record_blocks: int = 0
    stream_blocks: int = 0
    padding_tokens: int = 0
    stream_tail_packed_tokens: int = 0  # plain text short of a block, packed with the records (mixed corpora)
    stream_tail_dropped_tokens: int = 0  # the same where nothing is padded anyway (plain text only)
    longest_record: int = 0

    def to_meta(self, spec: DataSpec) -> dict[str, Any]:
        share = self.padding_tokens / max(1, self.record_blocks * spec.seq_len)
        return {**spec.packing_meta(), **self.__dict__, "padding_share": round(share, 6)}


def describe(meta: dict[str, Any]) -> str:
    """One log line about how the data was packed (from meta.json's `packing`)."""
    p = meta["packing"]
    if not p["record_blocks"]:
        return f"stream packing (TRAIN_PACKING={p['packing']}): records may span sequences"
    text = (f"{p['records_packed']} records packed whole into {p['record_blocks']} sequences "
            f"(TRAIN_PACKING={p['packing']}), {100 * p['padding_share']:.1f}% padding")  # fmt: skip
    if p["stream_blocks"]:
        text += f"; {p['stream_blocks']} sequences of plain text streamed"
    if p.get("stream_tail_packed_tokens"):
        text += f"; the plain text's last {p['stream_tail_packed_tokens']} tokens packed with the records"
    return text


def trained_flags(length: int, mask: np.ndarray | None) -> np.ndarray:
    """FLAG_TRAINED where the loss is taken: everywhere without a loss mask (plain text), else where the mask says."""
    return np.ones(length, np.uint8) if mask is None else mask.astype(np.uint8) & FLAG_TRAINED


def report_left_out(meta: dict[str, Any]) -> None:
    """Say what packing left out of training (truncated, dropped), counted."""
    p, seq_len = meta["packing"], meta["seq_len"]
    if p.get("stream_tail_dropped_tokens"):
        log.info("data: the plain text's last %d tokens (short of one TRAIN_SEQ_LEN=%d sequence) are left out",
                 p["stream_tail_dropped_tokens"], seq_len)  # fmt: skip
    if p["records_truncated"]:
        log.warning("data: %d record(s) longer than TRAIN_SEQ_LEN=%d were truncated to it (longest: %d tokens; "
                    "TRAIN_LONG_RECORDS=drop drops them instead)", p["records_truncated"], seq_len,
                    p["longest_record"])  # fmt: skip
    if p["records_dropped_too_long"]:
        log.warning("data: %d record(s) longer than TRAIN_SEQ_LEN=%d were dropped (TRAIN_LONG_RECORDS=drop; longest: "
                    "%d tokens)", p["records_dropped_too_long"], seq_len, p["longest_record"])  # fmt: skip
    if p["records_dropped_untrained"]:
        cut = p.get("records_cut_untrained", 0)
        log.warning("data: %d record(s) had no token to train on (within TRAIN_SEQ_LEN=%d) and were dropped%s",
                    p["records_dropped_untrained"], seq_len, f" ({cut} because TRAIN_LONG_RECORDS=truncate cut off "
                    "every answer)" if cut else "")  # fmt: skip


def nothing_packed(source: Any, stats: PackStats, spec: DataSpec) -> str:
    """Why no record of `source` is left to train on, naming TRAIN_LONG_RECORDS as it is set, and what to change."""
    dropped = stats.records_dropped_too_long + stats.records_dropped_untrained
    head = f"{source.variable}: {source.describe()}: none of its {dropped} record(s) has a token to train on"
    seq_len, longest, first = spec.seq_len, stats.longest_record, stats.first_trained_at
    where = f"the longest record is {longest} tokens" + (
        f", the first answer starts at token {first} at the earliest" if first >= 0 else ""
    )
    if spec.long_records == "truncate" and stats.records_cut_untrained:
        return (
            f"{head}: TRAIN_LONG_RECORDS=truncate cut every answer off at TRAIN_SEQ_LEN={seq_len} "
            f"({stats.records_cut_untrained} record(s) kept only their prompt; {where}); raise TRAIN_SEQ_LEN "
            f"above {first} ({longest} keeps every record whole), or shorten the prompts"
        )
    if spec.long_records == "drop" and stats.records_dropped_too_long:
        return (f"{head}: TRAIN_LONG_RECORDS=drop dropped {stats.records_dropped_too_long} longer than "
                f"TRAIN_SEQ_LEN={seq_len}, {stats.records_dropped_untrained} had nothing to train on; {where}; raise "
                f"TRAIN_SEQ_LEN to {longest}" + (
                    f", or set TRAIN_LONG_RECORDS=truncate (it keeps answers that start before token {seq_len})"
                    if 0 <= first < seq_len else ""))  # fmt: skip
    return (f"{head}: none has a trained token (TRAIN_LOSS_ON={spec.loss_on}); give records with answers to "
            "train on")  # fmt: skip


def open_bins_for(seq_len: int) -> int:
    return max(MIN_OPEN_BINS, min(MAX_OPEN_BINS, PACK_WINDOW_TOKENS // seq_len))


@dataclass
class _Bin:
    ids: np.ndarray
    flags: np.ndarray
    fill: int = 0


@dataclass
class Packer:
    """Feeds pieces to a ShardWriter as whole `seq_len` blocks: records by best fit, plain text as a stream.

    `writer.append(ids, flags)` receives blocks of exactly `seq_len` tokens; `close()` flushes the open sequences
    and settles the stream's tail that did not fill a block."""

    writer: Any
    spec: DataSpec
    dtype: str
    pad_id: int
    open_bins: int = 0
    seq_len: int = field(init=False)
    stats: PackStats = field(default_factory=PackStats)
    _bins: dict[int, _Bin] = field(default_factory=dict)
    _rooms: list[tuple[int, int]] = field(default_factory=list)  # (room left, bin serial), sorted
    _serial: int = 0
    _free: list[_Bin] = field(default_factory=list)
    _window: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # records not yet placed
    _partial: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # a record that goes on
    _partial_len: int = 0
    _tail: list[tuple[np.ndarray, np.ndarray | None]] = field(default_factory=list)  # stream tokens short of a block
    _tail_len: int = 0

    def __post_init__(self) -> None:
        self.seq_len = self.spec.seq_len
        self.open_bins = self.open_bins or open_bins_for(self.seq_len)

    def add(self, piece: Any) -> None:
        """A tokenized unit (shards.Piece): its records one by one, or its tokens onto the stream."""
        if self.spec.records_for(piece.mask is not None):
            self._records(piece)
        else:
            self._stream(piece.ids, piece.mask)

    # ---- records ----

    def _records(self, piece: Any) -> None:
        ids, lengths = piece.ids, np.asarray(piece.lengths, np.int64)
        if int(lengths.sum()) != len(ids):
            raise ValueError(f"record lengths {int(lengths.sum())} != {len(ids)} tokens in a piece")
        flags = trained_flags(len(ids), piece.mask)
        ends = np.cumsum(lengths)
        starts = ends - lengths
        learnable = self._learnable(flags, starts, lengths)
        last = len(lengths) - 1
        for index, (start, end) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
            goes_on = piece.continues and index == last
            if self._partial or goes_on:
                self._hold((ids[start:end], flags[start:end]))
                if not goes_on:
                    self._record(*self._take_partial())
            else:
                self._admit(ids[start:end], flags[start:end], end - start, learnable[index] > 0)

    def _learnable(self, flags: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> list[bool]:
        """Whether each record has a trained token after its first (which is never a target); per piece, vectorized.
        A truncated record is checked again on what is kept of it (`_admit`)."""
        if flags.all():
            return (lengths > 1).tolist()
        if not lengths.all():  # an empty record: reduceat needs non-empty segments
            return [bool(flags[a + 1 : a + n].any()) for a, n in zip(starts.tolist(), lengths.tolist(), strict=True)]
        trained = np.add.reduceat(flags, starts, dtype=np.int64) - flags[starts]
        return (trained > 0).tolist()

    def _hold(self, part: tuple[np.ndarray, np.ndarray]) -> None:
        """Part of a record that spans pieces (a .txt document); only what can still be trained is kept."""
        self._partial_len += len(part[0])
        kept = sum(len(p[0]) for p in self._partial)
        if kept <= self.seq_len:
            self._partial.append((part[0][: self.seq_len + 1 - kept].copy(), part[1][: self.seq_len + 1 - kept].copy()))

    def _take_partial(self) -> tuple[np.ndarray, np.ndarray, int]:
        ids = np.concatenate([p[0] for p in self._partial])
        flags = np.concatenate([p[1] for p in self._partial])
        length, self._partial, self._partial_len = self._partial_len, [], 0
        return ids, flags, length

    def _record(self, ids: np.ndarray, flags: np.ndarray, length: int) -> None:
        """A record held across pieces, now complete (`length` tokens, of which `ids` keeps the first seq_len + 1)."""
        self._admit(ids, flags, length, bool(flags[1 : self.seq_len].any()))

    def _admit(self, ids: np.ndarray, flags: np.ndarray, length: int, learnable: bool) -> None:
        """Count, truncate or drop one record, then queue it for placing. `flags`: 1 where trained, else 0."""
        if length == 0:
            return
        self.stats.longest_record = max(self.stats.longest_record, length)
        if length > self.seq_len:
            if self.spec.long_records == "drop":
                self.stats.records_dropped_too_long += 1
                self._note_first_trained(flags)
                return
            kept = bool(flags[1 : self.seq_len].any())
            if learnable and not kept:
                self.stats.records_cut_untrained += 1
                self._note_first_trained(flags)
            ids, flags = ids[: self.seq_len], flags[: self.seq_len]
            self.stats.records_truncated += 1
            learnable = kept
        if not learnable:
            self.stats.records_dropped_untrained += 1
            return
        self._window.append((ids.copy(), flags.copy()))
        self.stats.records_packed += 1
        if len(self._window) >= self.open_bins:
            self._flush_window()

    def _note_first_trained(self, flags: np.ndarray) -> None:
        """Where a dropped record's first trained token is (the earliest over such records), for the message."""
        trained = np.flatnonzero(flags[1:])
        if len(trained):
            at, before = int(trained[0]) + 1, self.stats.first_trained_at
            self.stats.first_trained_at = at if before < 0 else min(before, at)

    def _flush_window(self) -> None:
        """Longest records first (best fit decreasing): the short ones then fill the room the long ones leave."""
        order = sorted(range(len(self._window)), key=lambda i: -len(self._window[i][0]))
        for i in order:
            self._place(*self._window[i])
        self._window = []

    def _place(self, ids: np.ndarray, flags: np.ndarray) -> None:
        """Best fit: the open sequence with the least room that still holds the record, else a new one."""
        n = len(ids)
        at = bisect.bisect_left(self._rooms, (n, -1))
        if at < len(self._rooms):
            room, serial = self._rooms.pop(at)
        else:
            room, serial = self.seq_len, self._new_bin()
        box = self._bins[serial]
        box.ids[box.fill : box.fill + n] = ids
        box.flags[box.fill : box.fill + n] = flags
        box.flags[box.fill] |= FLAG_START
        box.fill += n
        if room - n == 0:
            self._emit(serial)
        else:
            bisect.insort(self._rooms, (room - n, serial))
        if len(self._bins) > self.open_bins:  # the fullest open sequence is unlikely to take another record
            self._emit(self._rooms.pop(0)[1])

    def _new_bin(self) -> int:
        self._serial += 1
        if self._free:
            box = self._free.pop()
        else:
            box = _Bin(np.empty(self.seq_len, self.dtype), np.empty(self.seq_len, np.uint8))
        box.fill = 0
        self._bins[self._serial] = box
        return self._serial

    def _emit(self, serial: int) -> None:
        box = self._bins.pop(serial)
        if box.fill < self.seq_len:  # padding: its own segment, never trained
            box.ids[box.fill :] = self.pad_id
            box.flags[box.fill :] = 0
            box.flags[box.fill] = FLAG_START
            self.stats.padding_tokens += self.seq_len - box.fill
        self.writer.append(box.ids, box.flags)
        self.stats.record_blocks += 1
        self._free.append(box)

    # ---- stream ----

    def _stream(self, ids: np.ndarray, mask: np.ndarray | None) -> None:
        """Plain text onto the stream: whole blocks go straight to the writer, the rest waits for the next piece."""
        if self._tail_len:
            need = self.seq_len - self._tail_len
            self._tail.append((ids[:need], None if mask is None else mask[:need]))
            self._tail_len += min(need, len(ids))
            ids, mask = ids[need:], None if mask is None else mask[need:]
            if self._tail_len < self.seq_len:
                return
            self._write_stream(*self._joined_tail())
        whole = len(ids) // self.seq_len * self.seq_len
        if whole:
            self._write_stream(ids[:whole], None if mask is None else mask[:whole])
        if whole < len(ids):
            self._tail = [(ids[whole:].copy(), None if mask is None else mask[whole:].copy())]
            self._tail_len = len(ids) - whole

    def _joined_tail(self) -> tuple[np.ndarray, np.ndarray | None]:
        ids = np.concatenate([t[0] for t in self._tail])
        mask = None
        if any(t[1] is not None for t in self._tail):
            mask = np.concatenate([np.ones(len(t[0]), np.uint8) if t[1] is None else t[1] for t in self._tail])
        self._tail, self._tail_len = [], 0
        return ids, mask

    def _write_stream(self, ids: np.ndarray, mask: np.ndarray | None) -> None:
        self.writer.append(ids, mask)
        self.stats.stream_blocks += len(ids) // self.seq_len

    # ---- the end ----

    def close(self) -> None:
        """Flush the open sequences and settle the stream's tail (plain text short of a block): packed with the
        records where there are any (their sequences are padded anyway), written alone where it is all there is (the
        writer pads it into one block), else left out and counted."""
        if self._partial:
            self._record(*self._take_partial())
        if self._tail_len and self.stats.records_packed:
            ids, mask = self._joined_tail()
            self.stats.stream_tail_packed_tokens = len(ids)
            self._window.append((ids, trained_flags(len(ids), mask)))
        self._flush_window()
        for _room, serial in sorted(self._rooms):
            self._emit(serial)
        self._rooms = []
        if not self._tail_len:
            return
        ids, mask = self._joined_tail()
        if self.writer.tokens == 0:
            self.writer.append(ids, mask)
        else:
            self.stats.stream_tail_dropped_tokens = len(ids)


def first_records(piece: Any, count: int) -> Any:
    """A tokenized piece (shards.Piece) cut after its first `count` records: a mix source's max_records
    (trainer.data.mix). Whole when it holds no more than `count`."""
    if piece.lengths is None or count >= len(piece.lengths) or count >= piece.records:
        return piece
    end = int(piece.lengths[:count].sum())
    return dataclasses.replace(piece, ids=piece.ids[:end], mask=None if piece.mask is None else piece.mask[:end],
                               lengths=piece.lengths[:count], continues=False, records=count)  # fmt: skip
