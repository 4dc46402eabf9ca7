"""Streaming tokenization into memory-mapped token shards.

`prepare(source, tokenizer, spec, folder)` reads the corpus as bounded work units
(readers.py), tokenizes them (worker processes for the byte-level tokenizer; the Rust tokenizer's own threads for
a model folder's tokenizer) into records ([BOS where the tokenizer adds one] text EOS), packs them (packing.py:
whole records per sequence, or one stream) and appends whole `seq_len` blocks to shard files:

    folder/tokens-00000.bin   uint16 (vocab <= 65536) or uint32 token ids, SHARD_TOKENS at most per shard
    folder/mask-00000.bin     uint8 flags: 1 where the loss is taken, 2 on a record's first token (packing.py);
                              only where some token is not trained or records are packed
    folder/meta.json          seq_len, dtype, blocks per shard, counts, skipped lines, packing (written last)

At most IN_FLIGHT_PER_WORKER units per worker are in flight, so the peak memory of the main process is about
(workers x IN_FLIGHT_PER_WORKER + 1) x (unit + its tokens), plus the largest parquet row group or .json document,
whatever the corpus size; each worker holds one unit. The stream's tail shorter than `seq_len` is settled by the
packer (packing.py): packed with the records, the one padded block where it is all there is, else left out and counted.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainer.data.cache import Stopped, never
from trainer.data.discovery import DataSource
from trainer.data.formats import too_many_bad_lines
from trainer.data.packing import Packer, first_records, nothing_packed
from trainer.data.readers import Columns, LineChunk, iter_units, parse_chunk
from trainer.data.spec import DataSpec
from trainer.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger("trainer")

SHARD_TOKENS = 1 << 28  # 512 MiB of uint16 per shard file
IN_FLIGHT_PER_WORKER = 2
PARALLEL_MIN_BYTES = 32 << 20  # smaller corpora are tokenized in-process: starting workers would cost more
PARALLEL_MIN_CORES = 4  # with fewer, the workers and the main process (reading, writing) compete for the cores
MAX_WORKERS = 32
BAD_LINES_LOGGED = 20


# ---- tokenizing one unit ----------------------------------------------------------------------------------------


@dataclass
class Encoder:
    """Token ids for Columns. The byte-level tokenizer is exact UTF-8, so it needs no tokenizer object (and pickles
    small, for worker processes); any other tokenizer runs its Rust batch encoder in this process."""

    eos: int
    dtype: str
    tokenizer: Any = None  # None: byte-level
    bos: int | None = None  # the BOS the tokenizer puts before a text (None: it adds none)
    chat: Any = None  # chat.ChatEncoder: conversations through the chat template

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, loss_on: str = "assistant") -> Encoder:
        from trainer.data.chat_encoder import ChatEncoder
        from trainer.tokenizer import is_byte_level

        dtype = "uint16" if len(tokenizer) <= 1 << 16 else "uint32"
        backend = None if is_byte_level(tokenizer) else tokenizer
        return cls(int(tokenizer.eos_token_id), dtype, backend, added_bos(tokenizer),
                   ChatEncoder(tokenizer, loss_on, dtype))  # fmt: skip

    @property
    def byte_level(self) -> bool:
        return self.tokenizer is None

    def encode(self, array: Any) -> list[np.ndarray]:
        texts = [t if isinstance(t, str) else t.decode("utf-8", "replace") for t in array.to_pylist()]
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            encodings = backend.encode_batch_fast(texts, add_special_tokens=False)
            return [np.asarray(e.ids, dtype=self.dtype) for e in encodings]
        ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        return [np.asarray(x, dtype=self.dtype) for x in ids]


@dataclass
class Piece:
    """The tokens of one unit, and what was seen while making them."""

    ids: np.ndarray
    mask: np.ndarray | None = None  # 1 where the loss is taken; None: everywhere
    lengths: np.ndarray | None = None  # int64: each record's token count, in order (sum == len(ids))
    continues: bool = False  # the last record goes on in the next piece (a .txt document spans pieces)
    records: int = 0
    without_text: int = 0
    bad: list[str] = field(default_factory=list)
    worker_rss: int = 0  # peak resident bytes of the worker process that made it (0: made in the main process)


def tokenize_unit(unit: LineChunk | Columns, encoder: Encoder, text_field: str) -> Piece:
    columns = parse_chunk(unit, text_field) if isinstance(unit, LineChunk) else unit
    if columns.conversations is not None:
        return _conversations(columns, encoder)
    if columns.prompts is not None:
        ids, mask, lengths = _pairs(columns, encoder)
        if getattr(encoder.chat, "loss_on", "") == "all":  # TRAIN_LOSS_ON=all: the prompts train too
            mask = np.ones_like(mask)
    else:
        (ids, lengths), mask = _texts(columns, encoder), None
    return Piece(ids, mask, lengths, columns.eos == "none", columns.records, columns.without_text, columns.bad)


def added_bos(tokenizer: Any) -> int | None:
    """The BOS id the tokenizer itself puts before a text (Llama's do, GPT-2's and Qwen's do not), else None."""
    bos = tokenizer.bos_token_id
    if bos is None:
        return None
    with_special = tokenizer("a", add_special_tokens=True)["input_ids"]
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    return int(bos) if with_special[:1] == [bos] and plain[:1] != [bos] else None


def _with_bos(ids: np.ndarray, encoder: Encoder) -> list[np.ndarray]:
    """[BOS, ids] where the tokenizer adds a BOS, unless the text already starts with it (never doubled)."""
    if encoder.bos is None or (len(ids) and ids[0] == encoder.bos):
        return [ids]
    return [np.array([encoder.bos], encoder.dtype), ids]


def _texts(columns: Columns, encoder: Encoder) -> tuple[np.ndarray, np.ndarray]:
    """(ids, record lengths): each record is [BOS] text EOS; a .txt chunk is (part of) one document."""
    if encoder.byte_level:
        return _utf8_tokens(columns.texts, encoder, columns.eos)
    pieces = encoder.encode(columns.texts)
    eos = np.array([encoder.eos], dtype=encoder.dtype)
    if columns.eos == "each":
        records = [np.concatenate([*_with_bos(piece, encoder), eos]) for piece in pieces]
        pieces, lengths = records, [len(r) for r in records]
    else:
        if columns.starts_document and pieces:
            pieces[0] = np.concatenate(_with_bos(pieces[0], encoder))
        if columns.eos == "last":
            pieces.append(eos)
        lengths = [sum(len(p) for p in pieces)]
    ids = np.concatenate(pieces) if pieces else np.zeros(0, encoder.dtype)
    return ids, np.asarray(lengths if len(ids) else [], np.int64)


def _utf8_tokens(array: Any, encoder: Encoder, eos: str) -> tuple[np.ndarray, np.ndarray]:
    """Byte-level ids straight from the arrow buffers: the UTF-8 bytes, with EOS after each record (vectorized).
    The byte-level tokenizer adds no BOS."""
    import pyarrow as pa

    array = array.cast(pa.large_binary())
    if len(array) == 0:
        return np.zeros(0, encoder.dtype), np.zeros(0, np.int64)
    _, offsets_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64)[array.offset : array.offset + len(array) + 1]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    data = data[offsets[0] : offsets[-1]].astype(encoder.dtype)
    if eos == "each":
        return np.insert(data, offsets[1:] - offsets[0], encoder.eos), np.diff(offsets) + 1
    if eos == "last":
        data = np.append(data, np.array([encoder.eos], encoder.dtype))
    return data, np.asarray([len(data)] if len(data) else [], np.int64)


def _pairs(columns: Columns, encoder: Encoder) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[BOS] prompt completion EOS per record; the loss is taken on the completion and the EOS only."""
    if encoder.byte_level:
        prompts = [np.frombuffer(p, np.uint8).astype(encoder.dtype) for p in _utf8(columns.prompts)]
        completions = [np.frombuffer(c, np.uint8).astype(encoder.dtype) for c in _utf8(columns.completions)]
    else:
        prompts, completions = encoder.encode(columns.prompts), encoder.encode(columns.completions)
    eos = np.array([encoder.eos], encoder.dtype)
    ids, mask, lengths = [], [], []
    for p, c in zip(prompts, completions, strict=True):
        prompt = _with_bos(p, encoder)
        ids += [*prompt, c, eos]
        untrained = sum(len(part) for part in prompt)
        mask += [np.zeros(untrained, np.uint8), np.ones(len(c) + 1, np.uint8)]
        lengths.append(untrained + len(c) + 1)
    if not ids:
        return np.zeros(0, encoder.dtype), np.zeros(0, np.uint8), np.zeros(0, np.int64)
    return np.concatenate(ids), np.concatenate(mask), np.asarray(lengths, np.int64)


def _conversations(columns: Columns, encoder: Encoder) -> Piece:
    """Each conversation whole, through the chat template (chat.ChatEncoder.encode_all)."""
    ids, mask, lengths, bad = encoder.chat.encode_all(columns.conversations, columns.bad)
    return Piece(ids, mask, records=len(lengths), bad=bad, lengths=lengths)


def _utf8(array: Any) -> list[bytes]:
    return [t.encode() if isinstance(t, str) else t for t in array.to_pylist()]


# ---- running units in order, in workers or here ---------------------------------------------------------------


_WORKER: dict[str, Any] = {}


def _init_worker(encoder: Encoder, text_field: str) -> None:
    import signal

    for signum in (signal.SIGINT, signal.SIGTERM):  # the parent stops the pool; a signal to the group is its to handle
        signal.signal(signum, signal.SIG_IGN)
    _WORKER.update(encoder=encoder, text_field=text_field)


def _work(unit: LineChunk | Columns) -> Piece:
    piece = tokenize_unit(unit, _WORKER["encoder"], _WORKER["text_field"])
    piece.worker_rss = peak_rss_bytes()
    return piece


def peak_rss_bytes() -> int:
    """This process's peak resident memory (VmHWM). Not ru_maxrss: that keeps the forking parent's peak across exec,
    so a spawned worker or a subprocess would report its parent's memory."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker_count(encoder: Encoder, corpus_bytes: int) -> int:
    """Worker processes for the byte-level path (0: in this process); other tokenizers use their own threads."""
    cores = len(os.sched_getaffinity(0))
    if not encoder.byte_level or corpus_bytes < PARALLEL_MIN_BYTES or cores < PARALLEL_MIN_CORES:
        return 0
    return min(MAX_WORKERS, cores - 1)  # one core for the main process


def tokenize_all(units: Iterable[LineChunk | Columns], encoder: Encoder, text_field: str, workers: int
                 ) -> Iterator[Piece]:  # fmt: skip
    """The units' Pieces, in corpus order, with a bounded number of units in flight."""
    if workers == 0:
        for unit in units:
            yield tokenize_unit(unit, encoder, text_field)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")  # the parent may hold torch's threads: never fork it
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                             initargs=(encoder, text_field)) as pool:  # fmt: skip
        in_flight: deque[Any] = deque()
        for unit in units:
            in_flight.append(pool.submit(_work, unit))
            if len(in_flight) >= workers * IN_FLIGHT_PER_WORKER:
                yield in_flight.popleft().result()
        while in_flight:
            yield in_flight.popleft().result()


# ---- writing shards ----------------------------------------------------------------------------------------------


class ShardWriter:
    """Appends tokens to shard files of whole blocks; `finish` drops the ragged tail and writes meta.json."""

    def __init__(self, folder: Path, seq_len: int, dtype: str, pad_id: int) -> None:
        self.folder, self.seq_len, self.dtype, self.pad_id = folder, seq_len, np.dtype(dtype), pad_id
        self.shard_tokens = max(1, SHARD_TOKENS // seq_len) * seq_len
        self.shards: list[int] = []  # tokens written per shard
        self.has_mask = False
        self._files: dict[str, Any] = {}

    @property
    def tokens(self) -> int:
        return sum(self.shards)

    def append(self, ids: np.ndarray, mask: np.ndarray | None) -> None:
        if mask is not None and not self.has_mask:
            self._start_mask()
        if self.has_mask and mask is None:
            mask = np.ones(len(ids), np.uint8)
        written_mask = mask if self.has_mask else None
        start = 0
        while start < len(ids):
            if not self.shards or self.shards[-1] == self.shard_tokens:
                self._next_shard()
            take = min(len(ids) - start, self.shard_tokens - self.shards[-1])
            self._files["tokens"].write(ids[start : start + take].astype(self.dtype, copy=False).tobytes())
            if written_mask is not None:
                self._files["mask"].write(written_mask[start : start + take].tobytes())
            self.shards[-1] += take
            start += take

    def _path(self, kind: str, index: int) -> Path:
        return self.folder / f"{kind}-{index:05d}.bin"

    def _next_shard(self) -> None:
        self._close()
        self.shards.append(0)
        index = len(self.shards) - 1
        self._files["tokens"] = _open_for_append(self._path("tokens", index), "wb")
        if self.has_mask:
            self._files["mask"] = _open_for_append(self._path("mask", index), "wb")

    def _start_mask(self) -> None:
        """The first prompt/completion record: earlier tokens (plain text) train everywhere."""
        self.has_mask = True
        for index, count in enumerate(self.shards):
            with open(self._path("mask", index), "wb") as handle:
                for start in range(0, count, 1 << 24):
                    handle.write(np.ones(min(1 << 24, count - start), np.uint8).tobytes())
        if self.shards:
            self._files["mask"] = _open_for_append(self._path("mask", len(self.shards) - 1), "ab")

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._files.values():
            handle.close()

    def _close(self) -> None:
        for handle in self._files.values():
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
        self._files = {}

    def finish(self, meta: dict[str, Any]) -> dict[str, Any]:
        pad_from = None
        if self.tokens < self.seq_len:
            pad_from = self.tokens
            self.append(np.full(self.seq_len - self.tokens, self.pad_id, self.dtype), None)
        self._close()
        if self.shards[-1] % self.seq_len:
            self.shards[-1] -= self.shards[-1] % self.seq_len
            for kind, size in (("tokens", self.dtype.itemsize), ("mask", 1)):
                if kind == "tokens" or self.has_mask:
                    os.truncate(self._path(kind, len(self.shards) - 1), self.shards[-1] * size)
        meta = {**meta, "seq_len": self.seq_len, "dtype": self.dtype.name, "has_mask": self.has_mask,
                "blocks": [n // self.seq_len for n in self.shards], "pad_from": pad_from}  # fmt: skip
        write_json_synced(self.folder / "meta.json", meta)
        return meta


def _open_for_append(path: Path, mode: str) -> Any:
    return open(path, mode)  # stays open across appends; ShardWriter._close closes it


def write_json_synced(path: Path, data: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())


# ---- the whole preparation -------------------------------------------------------------------------------------


class Tally:
    """What the preparation saw besides tokens: records, records without text, malformed lines (bounded)."""

    def __init__(self, max_bad_lines: int, variable: str = "TRAIN_DATA") -> None:
        self.allowed, self.records, self.without_text = max_bad_lines, 0, 0
        self.bad_lines: list[str] = []
        self.variable = variable
        self.worker_rss = 0

    def add(self, piece: Piece) -> None:
        self.records += piece.records
        self.without_text += piece.without_text
        self.worker_rss = max(self.worker_rss, piece.worker_rss)
        for line in piece.bad:
            self.bad_lines.append(line)
            if len(self.bad_lines) <= BAD_LINES_LOGGED:
                log.warning("data: skipped malformed line %s", line)
        if len(self.bad_lines) > self.allowed:
            raise ConfigError(too_many_bad_lines(self.bad_lines[0], len(self.bad_lines), self.allowed, self.variable))

    def report(self, text_field: str) -> dict[str, Any]:
        if self.without_text:
            log.warning("data: %d record(s) had no %r value (null or missing): no text", self.without_text, text_field)
        if self.bad_lines:
            log.warning("data: %s: skipped %d malformed line(s) (TRAIN_DATA_MAX_BAD_LINES=%d)", self.variable,
                        len(self.bad_lines), self.allowed)  # fmt: skip
        return {"records": self.records, "records_without_text": self.without_text, "skipped_lines": self.bad_lines,
                "peak_rss_worker_bytes": self.worker_rss}  # fmt: skip


def corpus_bytes(source: DataSource) -> int:
    return sum(p.stat().st_size for p in source.identity_files() if p.exists())


def prepare(source: DataSource, tokenizer: PreTrainedTokenizerBase, spec: DataSpec, folder: Path,
            should_stop: Callable[[], bool] = never) -> dict[str, Any]:  # fmt: skip
    """Tokenize the whole source into shards in `folder` (which must exist and be empty), as `spec` says; returns
    meta.json.

    `should_stop()` is asked after each unit: True raises `Stopped` (a SIGTERM must not wait for a whole corpus).
    """
    start = time.perf_counter()
    encoder = Encoder.for_tokenizer(tokenizer, spec.loss_on)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else encoder.eos
    workers = worker_count(encoder, corpus_bytes(source)) if spec.workers is None else spec.workers
    tally, tokens, text_field = Tally(spec.max_bad_lines, source.variable), 0, spec.text_field
    with ShardWriter(folder, spec.seq_len, encoder.dtype, int(pad_id)) as writer:
        packer = Packer(writer, spec, encoder.dtype, int(pad_id))
        for piece in tokenize_all(iter_units(source, text_field), encoder, text_field, workers):
            piece = first_records(piece, spec.max_records - tally.records) if spec.max_records else piece
            tally.add(piece)
            tokens += len(piece.ids)
            packer.add(piece)
            if should_stop():
                raise Stopped
            if spec.max_records and tally.records >= spec.max_records:
                break  # a mix source's cap: the rest of the source is not read
        packer.close()
        if tokens == 0:
            raise ConfigError(f"TRAIN_DATA: {source.describe()} holds no text; add records or fix TRAIN_TEXT_FIELD")
        if writer.tokens == 0:
            raise ConfigError(nothing_packed(source, packer.stats, spec))
        seconds = time.perf_counter() - start
        cores = workers + 1 if workers else (len(os.sched_getaffinity(0)) if _rust_threads(encoder) else 1)
        speed = {"tokens": tokens, "seconds": round(seconds, 3), "workers": workers, "cores": cores,
                 "tokens_per_s": round(tokens / max(seconds, 1e-9))}  # fmt: skip
        return writer.finish({"source": source.describe(), **speed, **tally.report(text_field), "prepared_by": _who(),
                              "packing": packer.stats.to_meta(spec)})  # fmt: skip


def _who() -> dict[str, Any]:
    import socket

    ranks = {name.lower(): int(os.environ.get(name, "0") or 0) for name in ("RANK", "LOCAL_RANK")}
    return {"host": socket.gethostname(), "pid": os.getpid(), **ranks}


def _rust_threads(encoder: Encoder) -> bool:
    """Whether a model folder's tokenizer encodes batches on all cores (TOKENIZERS_PARALLELISM not turned off)."""
    parallel = os.environ.get("TOKENIZERS_PARALLELISM", "true").lower() not in ("0", "false", "off", "no")
    return not encoder.byte_level and parallel
