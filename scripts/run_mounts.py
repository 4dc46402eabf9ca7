"""What a scripts/run.py container mounts, and the record of it beside the run that `run.py reproduce OUTPUT_DIR`
mounts again, so that the options need not be repeated.

Mounts: ./data and ./models (read-only, where present) or --data/--models, ./output or --output (created as you),
the `trainkit-cache` volume or --cache-volume at /cache. RECORD_FILE in the run's output folder (TRAIN_OUTPUT_DIR
under the /output mount) holds the image, each mount (container path -> host path or volume name) and the env file
read: paths and names only, each value through trainer/secrets.py's rule, no environment value. It is written before
the container starts (or, for a folder the trainer creates, once it has); a start that did not get as far as its
provenance.json (refused: a second run on a locked folder, a config mistake) gets the earlier record back: the record
is the one of the start that made the run. It belongs to the container's user, as the rest of the folder.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import posixpath
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from errors import UserError
from hf_token import TARGET as TOKEN_TARGET

try:
    from trainer.provenance import PROVENANCE_FILE
    from trainer.secrets import mask_value
except ModuleNotFoundError as missing:
    from errors import exit_missing_package

    exit_missing_package(missing)

CACHE_VOLUME = "trainkit-cache"  # the same named volume as docker-compose.yml
RECORD_FILE = "run_py.json"
FORMAT = 1
OUTPUT = "/output"
# The recorded mounts reproduce gives again: container path -> (run.py's argument, its option). /output is not one:
# reproduce mounts the new folder's parent there. A named volume (/cache) is created empty when gone, so only host
# paths are checked.
REMOUNTED = {
    "/data": ("data", "--data"),
    "/models": ("models", "--models"),
    TOKEN_TARGET: ("hf_token_file", "--hf-token-file"),
    "/cache": ("cache_volume", "--cache-volume"),
}
VOLUMES = ("/cache",)
FIX_RECORD = "restore it, or remove it and give the run's --data, --models and --env-file to reproduce"


def bind(path: str | None, default: str | None, option: str) -> Path | None:
    """The absolute host path for a mount; None when the default is absent; UserError for a missing explicit one."""
    if path is None:
        candidate = Path(default).resolve() if default else None
        return candidate if candidate and candidate.exists() else None
    candidate = Path(path).expanduser().resolve()
    if not candidate.exists():
        raise UserError(f"{option} {path}: no such file or folder ({candidate}); create it or fix the path")
    return candidate


def output_folder(path: str | None) -> Path:
    """The output folder, created (as you, so it is yours) when its parent exists."""
    candidate = Path(path or "output").expanduser().resolve()
    if not candidate.exists():
        if not candidate.parent.is_dir():
            raise UserError(f"--output {path}: its parent folder {candidate.parent} does not exist")
        candidate.mkdir()
    if not candidate.is_dir():
        raise UserError(f"--output {path}: {candidate} is not a folder")
    return candidate


def volumes(args: argparse.Namespace) -> dict[str, dict[str, str]]:
    here = not args.from_record  # reproduce of a recorded run mounts what the run had, not this folder's
    found = {
        "/data": bind(args.data, "data" if here else None, "--data"),
        "/models": bind(args.models, "models" if here else None, "--models"),
    }
    mounts = {str(host): {"bind": target, "mode": "ro"} for target, host in found.items() if host}
    mounts[str(output_folder(args.output))] = {"bind": "/output", "mode": "rw"}
    mounts[args.cache_volume or CACHE_VOLUME] = {"bind": "/cache", "mode": "rw"}
    return mounts


def run_folder(environment: dict[str, str], mounts: dict[str, dict[str, str]]) -> Path | None:
    """The host folder the trainer writes: TRAIN_OUTPUT_DIR (default /output; relative to /output, the container's
    working directory) under the /output mount; None where it lies elsewhere."""
    inside = posixpath.normpath(posixpath.join(OUTPUT, environment.get("TRAIN_OUTPUT_DIR") or OUTPUT))
    host = next((Path(h) for h, m in mounts.items() if m["bind"] == OUTPUT), None)
    if host is None or not (inside == OUTPUT or inside.startswith(OUTPUT + "/")):
        return None
    return host / posixpath.relpath(inside, OUTPUT)


def describe(image: dict[str, str], mounts: dict[str, dict[str, str]], env_file: Path | None) -> dict[str, Any]:
    """The record: `image` as run.py passes it (TRAINKIT_IMAGE, TRAINKIT_IMAGE_ID), container path -> host path or
    volume, and the env file; every value through the secret rule."""
    return {
        "format": FORMAT,
        "written_by": "scripts/run.py",
        "image": {"reference": mask_value(image["TRAINKIT_IMAGE"]), "id": image.get("TRAINKIT_IMAGE_ID")},
        "mounts": {m["bind"]: mask_value(host) for host, m in sorted(mounts.items(), key=lambda i: i[1]["bind"])},
        "env_file": mask_value(str(env_file)) if env_file else None,
    }


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        found = path.stat()
    except OSError:
        return None
    return found.st_ino, found.st_mtime_ns


def _put(path: Path, text: bytes, owner: str) -> None:
    """`text` into `path` in one rename, owned by the container's user (`UID[:GID]`) where this process may say so
    (run as root): the output folder is theirs."""
    staged = path.with_name(f".tmp-{path.name}")
    staged.write_bytes(text)
    uid, _, gid = owner.partition(":")
    with contextlib.suppress(OSError):
        os.chown(staged, int(uid), int(gid or -1))
    os.replace(staged, path)


def _encode(record: dict[str, Any]) -> bytes:
    return (json.dumps(record, indent=2) + "\n").encode()


@contextlib.contextmanager
def kept(folder: Path | None, record: dict[str, Any], owner: str, detached: bool, log: Callable[[str], None]
         ) -> Iterator[None]:  # fmt: skip
    """Around a training container: RECORD_FILE in `folder`, written before the start (a run stopped hard keeps it)
    where the folder exists, else once the trainer made it; after an attached start that wrote no provenance.json
    (refused), the earlier record is put back. A detached start keeps the new record."""
    if folder is None:
        log(f"TRAIN_OUTPUT_DIR is not under {OUTPUT}: no {RECORD_FILE}; reproduce will need --data etc. again")
        yield
        return
    path, provenance = folder / RECORD_FILE, _stamp(folder / PROVENANCE_FILE)
    try:
        earlier = path.read_bytes() if path.is_file() else None
        written = folder.is_dir()
        if written:
            _put(path, _encode(record), owner)
    except OSError as exc:
        log(f"cannot write {path} ({exc.strerror}): reproduce of this run will need --data etc. again")
        yield
        return
    if not written and detached:
        log(f"{folder} does not exist yet: no {RECORD_FILE} for a detached start; reproduce will need --data etc.")
    try:
        yield
    finally:
        made = _stamp(folder / PROVENANCE_FILE) != provenance
        with contextlib.suppress(OSError):
            if detached or made == written:
                pass
            elif made:  # the trainer made the folder: the record follows
                _put(path, _encode(record), owner)
            elif earlier is not None:  # refused before its provenance: the record of the start that made the run
                _put(path, earlier, owner)
            else:
                path.unlink()


def after(folder: Path, record: dict[str, Any], owner: str, code: int) -> int:
    """A reproduce's new folder gets the record of what reproduce mounted once it is published (it must be empty
    before); `code`, the container's exit code, is returned."""
    if (folder / PROVENANCE_FILE).is_file() and not (folder / RECORD_FILE).exists():
        with contextlib.suppress(OSError):
            _put(folder / RECORD_FILE, _encode(record), owner)
    return code


def read(folder: Path) -> dict[str, Any] | None:
    """The record of a run's folder; None for a run not started by run.py (compose, a cluster job, an older
    run.py); UserError for one that cannot be read."""
    path = folder / RECORD_FILE
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{path} cannot be read ({exc}): {FIX_RECORD}") from None
    if not isinstance(record, dict) or not isinstance(record.get("mounts"), dict):
        raise UserError(f"{path} is not run.py's record (it has no `mounts`): {FIX_RECORD}")
    wrong = [f"`mounts` {target!r}: {_kind(host)} where a host path (text) goes"
             for target, host in record["mounts"].items() if not isinstance(host, str) or not host]  # fmt: skip
    if not isinstance(record.get("env_file"), (str, type(None))):
        wrong.append(f"`env_file`: {_kind(record['env_file'])} where a path (text) or null goes")
    image = record.get("image")
    if image is not None and not (isinstance(image, dict) and all(
            isinstance(image.get(k), (str, type(None))) for k in ("reference", "id"))):  # fmt: skip
        wrong.append(f"`image`: {_kind(image)} where an object with a `reference` and an `id` (text) goes")
    if wrong:
        raise UserError(f"{path} holds a value of the wrong type: {'; '.join(wrong)}. {FIX_RECORD}")
    return record


def _kind(value: Any) -> str:
    return "a list" if isinstance(value, list) else "an object" if isinstance(value, dict) else (
        "nothing" if value is None or value == "" else f"a {type(value).__name__} ({value!r})")  # fmt: skip


def mount_again(folder: Path, args: argparse.Namespace, log: Callable[[str], None]) -> None:
    """Each mount and the env file the run recorded, where the user gave no option of their own (that one is used,
    and the log says so). No record: this folder's ./data, ./models and ./.env, as any run. UserError naming a
    recorded host path that is gone and the option that replaces it."""
    record = read(folder)
    if record is None:
        log(
            f"{folder} has no {RECORD_FILE} (not started by run.py, or by an older one): mounting this folder's "
            "./data, ./models and ./.env as any run; give --data, --models, --env-file where the run used others"
        )
        return
    args.from_record = True  # nothing from the current folder: the run's own mounts, or none
    recorded = {**record["mounts"], "env_file": record.get("env_file")}
    options = {**REMOUNTED, "env_file": ("env_file", "--env-file")}
    used = []
    for target, (name, option) in options.items():
        given, then = getattr(args, name), recorded.get(target)
        if given is not None:
            if then != given and then != str(Path(given).expanduser().resolve()):
                log(f"{option} {given} given: used instead of the recorded {then or '(none)'}")
            continue
        if then and target not in VOLUMES and not Path(then).exists():
            what = f"read its environment from {then}" if target == "env_file" else f"mounted {then} at {target}"
            raise UserError(f"the run {what} (recorded in {folder / RECORD_FILE}); it is gone: restore it, or give "
                            f"{option} PATH instead")  # fmt: skip
        setattr(args, name, then)
        used += [f"{option} {then}"] if then else []
    log(f"as the run recorded in {folder / RECORD_FILE}: {', '.join(used) or 'no mounts, no env file'}")
