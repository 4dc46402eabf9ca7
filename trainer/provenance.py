"""What made a run, in one home: OUTPUT_DIR/provenance.json (the writer, the reader, and what goes in it).

A run records, beside run_config.json (its settings), the things outside the settings that decide its result: the
image it ran in (what the build wrote into it, BUILD_FILE, and what the host passed in: TRAINKIT_IMAGE,
TRAINKIT_IMAGE_DIGEST, TRAINKIT_IMAGE_ID; a run outside any image says so), every Python distribution it imported
with its version, the GPU, driver, CUDA and cuDNN, a sha256 of each input file, the Hub revisions, the chat
template's hash and the seed. Secrets never: the record goes through trainer.secrets' masking.
A data file's sha256 is taken while the data layer reads it for tokenization (`StreamHash`: no second pass over
the corpus); a file read otherwise (a cache hit in a new folder, Parquet/CSV/Arrow) is hashed in a pass of its own.
`python -m trainer diff` reads two of them. Torch-free (torch is asked only when the run already imported it);
imports only trainer.secrets (floor 1).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import json
import os
import platform
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from trainer.secrets import mask_secrets

PROVENANCE_FILE = "provenance.json"
BUILD_FILE = Path("/opt/trainkit/build.json")  # written by the image build (Dockerfile's last stage)
# the build's claims: what it built, kept or skipped and why (images/build_ext.py's manifest step)
MANIFEST_FILE = Path(os.environ.get("TRAINKIT_MANIFEST", "/opt/trainkit/build-manifest.json"))
FORMAT = 1
_HASH_BLOCK = 1 << 20
_streamed: dict[str, dict[str, Any]] = {}  # resolved path -> {"sha256", "size", "mtime_ns"}, taken while read
_stream_seconds = [0.0]  # time spent hashing in the read path (benchmarks/data_prep.py prints it)


def collect(
    data_files: Iterable[Path],
    hub: Mapping[str, Any],
    template_hash: str,
    seed: int,
    environ: Mapping[str, str] | None = None,
    build_file: Path = BUILD_FILE,
    previous: Mapping[str, Any] | None = None,
    online: Mapping[str, Any] | None = None,
    memory: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The provenance of the run in this process (secrets masked); `previous`: the data entries an earlier start
    recorded in the same output folder (a restart does not hash unchanged files again)."""
    env = os.environ if environ is None else environ
    record = {
        "format": FORMAT,
        **image(env, build_file),
        "python": platform.python_version(),
        "distributions": imported_distributions(),
        "accelerator": accelerator(),
        "data": fingerprints(data_files, previous or {}),
        "hub": dict(hub),
        "chat_template_hash": template_hash or None,
        "seed": seed,
        **({"online_rl": dict(online)} if online else {}),  # each reward file's sha256, the generation engine
        # the peak GPU memory predicted before the model loaded, by part (trainer.memory.predict), for the GPU above
        **({"memory_prediction": dict(memory)} if memory else {}),
    }
    return mask_secrets(json.loads(json.dumps(record, default=str)))


def write(folder: Path, record: Mapping[str, Any]) -> Path:
    """OUTPUT_DIR/provenance.json, staged and renamed into place."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / PROVENANCE_FILE
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, target)
    return target


def record_run(folder: Path, data_files: Iterable[Path], hub: Mapping[str, Any], template_hash: str,
               seed: int, online: Mapping[str, Any] | None = None,
               memory: Mapping[str, Any] | None = None) -> Path:  # fmt: skip
    """Collect this run's provenance and write it into `folder` (the run's one call)."""
    earlier = (read(folder) or {}).get("data")
    previous = earlier if isinstance(earlier, dict) else None
    return write(folder, collect(data_files, hub, template_hash, seed, previous=previous, online=online,
                                 memory=memory))


def exported(run: Mapping[str, Any] | None, quantized: Mapping[str, Any]) -> dict[str, Any]:
    """An exported model's provenance.json (`export --quant`): the run's record when it wrote one, and what the export
    quantized, each type's files (sha256) and its gate's figures (trainer/export/quant.py)."""
    record = dict(run) if run else {"format": FORMAT, "run": None}
    return mask_secrets(json.loads(json.dumps({**record, "export": {"quantized": dict(quantized)}}, default=str)))


def read(folder: Path) -> dict[str, Any] | None:
    """The provenance of an output folder; None when it has none (made by an older trainkit) or it is unreadable."""
    try:
        data = json.loads((Path(folder) / PROVENANCE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def require(folder: Path, then: str) -> dict[str, Any]:
    """The provenance of `folder`, or a ConfigError naming it as missing and what to do about it (`then`)."""
    from trainer.errors import ConfigError

    provenance = read(folder)
    if provenance is None:
        raise ConfigError(
            f"{Path(folder) / PROVENANCE_FILE} is missing or unreadable: the folder was made by an older trainkit "
            f"(before provenance was recorded) or is not a run's output folder; {then}"
        )
    return provenance


def reference(output_dir: Path) -> dict[str, str] | None:
    """What a checkpoint's record says of the run's provenance: `{"file": "../provenance.json", "sha256": ...}`;
    None when the run wrote none."""
    path = Path(output_dir) / PROVENANCE_FILE
    if not path.is_file():
        return None
    return {"file": f"../{PROVENANCE_FILE}", "sha256": file_sha256(path)}


def fingerprints(paths: Iterable[Path], previous: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """path -> {"sha256", "size", "mtime_ns"}: a full-content hash of each file, taken again only when its size or
    modification time differs from what `previous` recorded (the identity the tokenized cache trusts too)."""
    found: dict[str, dict[str, Any]] = {}
    for path in paths:
        stat = Path(path).stat()
        entry = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        before = _streamed.get(str(Path(path).resolve())) or previous.get(str(path))
        if not (isinstance(before, dict) and all(before.get(k) == v for k, v in entry.items())):
            before = {}  # never seen, or changed since: hash it again
        found[str(path)] = {"sha256": before.get("sha256") or file_sha256(path), **entry}
    return found


def remember_sha256(path: Path, sha256: str, size: int) -> None:
    """A file's sha256 taken by a reader that read it whole anyway (a training image), kept for `fingerprints` when
    the file still has the size it was read with."""
    stat = Path(path).stat()
    if stat.st_size == size:
        _streamed[str(Path(path).resolve())] = {"sha256": sha256, "size": size, "mtime_ns": stat.st_mtime_ns}


class StreamHash:
    """The sha256 of a file from the bytes a reader reads anyway: `open()` gives the file's own bytes (hand them to
    the decompressor), hashed as they pass; `finish()` after the reader met the end takes what is left (a
    decompressor may stop before trailing bytes) and records the hash for `fingerprints`, keyed by the identity
    (size, mtime) the file had when it was opened."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        stat = self.path.stat()
        self.identity = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        self.digest = hashlib.sha256()
        self.reader: _HashingReader | None = None

    def open(self) -> IO[bytes]:
        self.reader = _HashingReader(open(self.path, "rb"), self.digest)  # noqa: SIM115 (closed by the caller)
        return self.reader  # type: ignore[return-value]

    def finish(self) -> None:
        assert self.reader is not None, "open() first"
        while self.reader.read(_HASH_BLOCK):
            pass
        _streamed[str(self.path.resolve())] = {"sha256": self.digest.hexdigest(), **self.identity}


class _HashingReader(io.RawIOBase):
    def __init__(self, handle: IO[bytes], digest: Any) -> None:
        self._handle, self._digest = handle, digest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        count = self._handle.readinto(buffer) or 0  # type: ignore[attr-defined]
        start = time.perf_counter()
        self._digest.update(memoryview(buffer)[:count])
        _stream_seconds[0] += time.perf_counter() - start
        return count

    def close(self) -> None:
        self._handle.close()
        super().close()


def stream_hash_seconds() -> float:
    """Seconds this process spent hashing data files as they were read (StreamHash)."""
    return _stream_seconds[0]


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's whole content, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def image(env: Mapping[str, str], build_file: Path = BUILD_FILE) -> dict[str, Any]:
    """The image: what its build recorded and the reference the host started it from; `"image": null` and
    `"outside_image": true` outside any trainkit image."""
    try:
        build = json.loads(build_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        build = None
    reference, digest = env.get("TRAINKIT_IMAGE"), env.get("TRAINKIT_IMAGE_DIGEST")
    if build is None and not reference:
        return {"image": None, "outside_image": True}
    pinned = f"{repository(reference)}@{digest}" if reference and digest else reference
    found = {"reference": pinned, "id": env.get("TRAINKIT_IMAGE_ID"), "build": build}
    return {"image": found, "outside_image": False}


def inside_image(build_file: Path = BUILD_FILE) -> bool:
    """Whether this process runs in a trainkit image (its build wrote `build_file`), e.g. for the default folders."""
    return build_file.is_file()


def repository(reference: str) -> str:
    """`registry:5000/trainkit:cu128` or `trainkit@sha256:...` -> the repository without tag or digest."""
    name = reference.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    return f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]


def imported_distributions(modules: Iterable[str] | None = None) -> dict[str, str]:
    """Every installed distribution that provides a module this process imported: name -> version."""
    tops = {name.partition(".")[0] for name in (sys.modules if modules is None else modules)}
    owners = importlib.metadata.packages_distributions()
    found: dict[str, str] = {}
    for top in tops:
        for dist in owners.get(top, ()):
            try:
                found[dist] = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                continue
    return dict(sorted(found.items(), key=lambda item: item[0].lower()))


def accelerator() -> dict[str, Any]:
    """GPU model, driver, CUDA and cuDNN; torch is asked only when the run already imported it."""
    facts: dict[str, Any] = {"driver": _nvidia_driver()}
    torch = sys.modules.get("torch")
    if torch is None:
        return facts
    facts["cuda"] = torch.version.cuda
    facts["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    facts["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if (
        torch.cuda.is_available()) else []  # fmt: skip
    return facts


def _nvidia_driver() -> str | None:
    try:
        first = Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    words = first.split()
    return next((w for w in words if w[:1].isdigit() and "." in w), None)
