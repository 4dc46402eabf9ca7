"""The tokenized-data cache: its key, its atomic write, and the barrier that lets one process per node prepare it.

A cache entry is `CACHE_DIR/<key>/` (token shards + meta.json), keyed by the files' identity (path, size, mtime and
a hash of three 64 KiB samples of the content), the tokenizer and its chat template, and the data spec's fields
that shape the tokens (trainer.data.spec: TRAIN_SEQ_LEN, TRAIN_TEXT_FIELD, TRAIN_PACKING, ...). It is written into
`CACHE_DIR/.tmp-<key>-<host>-<pid>/`, fsynced and renamed into place, so a folder named by its key is always
complete. An interrupted preparation leaves only a .tmp folder, which the next preparation removes before it starts
again from the beginning. Every use checks the shards' sizes against meta.json: an entry that does not match (a
truncated or missing shard, no valid meta.json) is taken for absent, and local rank 0 replaces it.

Ranks: local rank 0 of each node prepares under an exclusive lock (`<key>.lock`; on shared storage the lock also
keeps nodes, and two separate commands, from preparing twice: the second waits, then maps the first's entry); the
other local ranks wait for the finished folder, for a failure marker from
the same torchrun run (then they stop with its message), or for WAIT_TIMEOUT_S. Every rank then maps the shards.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from trainer.data.discovery import DataSource
    from trainer.data.spec import DataSpec

log = logging.getLogger("trainer")

CACHE_VERSION = 6  # 6: a mixed corpus packs the plain text's tail with the records; 5: content samples in the key;
# 4: records packed whole, BOS per the tokenizer (3: memory-mapped token shards; 2: .npy arrays)
SAMPLE_BYTES = 1 << 16
WAIT_TIMEOUT_S = 4 * 3600
POLL_S = 0.5


class Stopped(Exception):
    """A SIGTERM/SIGINT arrived while the data was being prepared or waited for."""


def never() -> bool:
    return False


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    specials = f"eos={tokenizer.eos_token_id}|pad={tokenizer.pad_token_id}|bos={tokenizer.bos_token_id}"
    specials += f"|add_bos={getattr(tokenizer, 'add_bos_token', None)}"  # whether records start with BOS
    return hashlib.sha256(f"{text}|{specials}".encode()).hexdigest()


def cache_key(source: DataSource, tokenizer: PreTrainedTokenizerBase, spec: DataSpec) -> str:
    """The files' identity (hence their record layouts), the tokenizer, its chat template and what of the spec shapes
    the tokens (DataSpec.key: sequence length, text field, packing, loss)."""
    from trainer.data.chat import template_hash

    files = []
    for p in source.identity_files():
        st = p.stat()
        files.append([str(p.resolve()), st.st_size, st.st_mtime_ns, content_sample(p, st.st_size)])
    tok = tokenizer_fingerprint(tokenizer)
    chat = {"layouts": list(source.layouts), "template": template_hash(tokenizer)}
    blob = json.dumps({"v": CACHE_VERSION, "files": files, "tok": tok, "spec": spec.key(), "chat": chat})
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def content_sample(path: Path, size: int) -> str:
    """A hash of a file's first, middle and last SAMPLE_BYTES: with size and mtime in the key, an edit that keeps the
    size and restores the mtime is still seen when it touches one of those places (an edit elsewhere is not; delete
    the cache entry after such an edit). Three small reads per file."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for offset in sorted({0, max(0, size // 2 - SAMPLE_BYTES // 2), max(0, size - SAMPLE_BYTES)}):
            handle.seek(offset)
            digest.update(handle.read(SAMPLE_BYTES))
    return digest.hexdigest()[:16]


def default_cache_dir(output_dir: str) -> Path:
    """/cache/trainkit/data in the image (a volume shared by runs), else OUTPUT_DIR/.cache/data."""
    shared = Path("/cache")
    if shared.is_dir() and os.access(shared, os.W_OK):
        return shared / "trainkit" / "data"
    return Path(output_dir) / ".cache" / "data"


def read_meta(folder: Path) -> dict[str, Any] | None:
    """meta.json of a complete, undamaged cache entry; None when there is none (see `entry_problem`)."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    return None if entry_problem(folder, meta) else meta


def entry_problem(folder: Path, meta: Any) -> str | None:
    """What is wrong with a cache entry: a shard whose size does not match meta.json (truncated, replaced), a
    missing one, or a meta.json without the shard list. None when it is whole."""
    try:
        itemsize = int("".join(filter(str.isdigit, meta["dtype"]))) // 8  # uint16, int32...
        kinds = [("tokens", itemsize), ("mask", 1)] if meta["has_mask"] else [("tokens", itemsize)]
        expected = [(f"{kind}-{i:05d}.bin", blocks * int(meta["seq_len"]) * size)
                    for i, blocks in enumerate(meta["blocks"]) for kind, size in kinds]  # fmt: skip
    except (KeyError, TypeError, ValueError):
        return "meta.json lacks the shard list"
    for name, size in expected:
        try:
            actual = (folder / name).stat().st_size
        except OSError:
            return f"{name} is missing"
        if actual != size:
            return f"{name} has {actual} bytes, meta.json says {size}"
    return None


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0") or 0)


def _run_id() -> str:
    """Shared by every rank of one torchrun attempt; a failure marker from another run is not ours."""
    return f"{os.environ.get('TORCHELASTIC_RUN_ID', 'none')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """An exclusive flock; the kernel releases it when the holder exits, even by SIGKILL. Waiting for another
    process that holds it (a second `data` command, another node) is logged."""
    with open(lock_path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("data: another process is preparing %s (it holds %s); waiting for it, then using its entry",
                     lock_path.with_suffix(""), lock_path)  # fmt: skip
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _set_aside_damaged(cache_dir: Path, folder: Path) -> None:
    """A folder under the entry's name that read_meta refused (no valid meta.json, a shard of the wrong size) is
    removed so the new entry can take its name; the log says what was wrong with it."""
    if not folder.exists():
        return
    try:
        problem = entry_problem(folder, json.loads((folder / "meta.json").read_text()))
    except (OSError, ValueError):
        problem = "no valid meta.json"
    log.warning("data: the cache entry %s is damaged (%s); preparing it again", folder, problem)
    doomed = cache_dir / f".tmp-{folder.name}-damaged-{os.getpid()}"
    os.rename(folder, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _remove_interrupted(cache_dir: Path, key: str) -> None:
    for stale in cache_dir.glob(f".tmp-{key}-*"):
        log.warning("data: removing %s, left by an interrupted preparation; preparing again", stale)
        shutil.rmtree(stale, ignore_errors=True)


def prepare_once(cache_dir: Path, key: str, build: Callable[[Path], dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """(meta, prepared_here): the finished entry, made here by `build(tmp_folder) -> meta` unless it exists."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    folder, failed = cache_dir / key, cache_dir / f"{key}.failed"
    with _exclusive(cache_dir / f"{key}.lock"):
        meta = read_meta(folder)
        if meta is not None:
            return meta, False
        failed.unlink(missing_ok=True)
        _set_aside_damaged(cache_dir, folder)
        _remove_interrupted(cache_dir, key)
        tmp = cache_dir / f".tmp-{key}-{socket.gethostname()}-{os.getpid()}"
        tmp.mkdir()
        try:
            meta = build(tmp)
            _fsync_dir(tmp)
            os.rename(tmp, folder)
            _fsync_dir(cache_dir)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if not isinstance(exc, (Stopped, KeyboardInterrupt)):  # a stop is not a failure: the requeue prepares
                _mark_failed(failed, exc)
            raise
        return meta, True


def wait_for(cache_dir: Path, key: str, timeout_s: float = WAIT_TIMEOUT_S, should_stop: Callable[[], bool] = never
             ) -> dict[str, Any]:  # fmt: skip
    """meta.json of the entry local rank 0 is preparing; a clear error if it fails or takes longer than timeout_s."""
    folder, failed = cache_dir / key, cache_dir / f"{key}.failed"
    deadline = time.monotonic() + timeout_s
    log.info("data: local rank %d waits for local rank 0 to prepare %s", local_rank(), folder)
    while True:
        meta = read_meta(folder)
        if meta is not None:
            return meta
        marker = _failure(failed)
        if marker:
            raise ConfigError(f"local rank 0 could not prepare the data: {marker}")
        if should_stop():
            raise Stopped
        if time.monotonic() > deadline:
            raise ConfigError(
                f"local rank {local_rank()} waited {timeout_s:.0f}s for local rank 0 to prepare the tokenized data in "
                f"{folder}, and it is not there; see local rank 0's log (did it fail, hang or run out of memory?). "
                "Preparing it once ahead of the run (one process, same TRAIN_* settings) avoids the wait"
            )
        time.sleep(POLL_S)


def _mark_failed(marker: Path, exc: BaseException) -> None:
    message = exc.message if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
    with contextlib.suppress(OSError):  # the waiting ranks' news; never hide the error itself
        marker.write_text(json.dumps({"run": _run_id(), "message": message, "time": time.time()}))


def _failure(marker: Path) -> str | None:
    """The message of a failure marker from this torchrun attempt. A requeue keeps the run id (Slurm's job id) and
    the restart count, so a marker written before this process started is an earlier attempt's, not ours."""
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    if data.get("run") != _run_id() or data.get("time", 0) < process_start_time():
        return None
    return data.get("message")


def process_start_time() -> float:
    """When this process started (Unix time; Linux's /proc), else 0."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(int(x.split()[1]) for x in Path("/proc/stat").read_text().splitlines() if x.startswith("btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return 0.0
    return boot + ticks / os.sysconf("SC_CLK_TCK") - 1.0  # btime is whole seconds
