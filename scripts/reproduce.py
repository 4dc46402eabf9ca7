"""`python scripts/run.py [options] reproduce OUTPUT_DIR [--steps N] [--output NEW] [--allow-changed-data]`:
the host's half of reproducing a run.

It picks the image the run recorded in OUTPUT_DIR/provenance.json, by digest (on this engine, else pulled from the
registry its reference names), or by the engine's image id for an image that was never pushed; --image overrides.
Then run.py starts it with the mounts and the env file the run recorded (run_mounts.py's OUTPUT_DIR/run_py.json; an
option given, --data DIR, replaces its recorded folder; a run without the record gets ./data and ./.env as any run),
OUTPUT_DIR mounted read-only at ORIGINAL and NEW's parent folder at /output, and `python -m trainer reproduce`
inside does the rest: the data's sha256, the GPUs, the re-run into a staged folder and the comparison
(trainer/reproduce_command.py, the one definition). A CPU run is reproduced without GPUs. run.py's options may come
before `reproduce` too.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import docker
from docker.errors import APIError, ImageNotFound
from errors import UserError
from registry import DIGEST_REF

try:
    from trainer.errors import ConfigError
    from trainer.provenance import PROVENANCE_FILE, read, require
except ModuleNotFoundError as missing:
    from errors import exit_missing_package

    exit_missing_package(missing)

ORIGINAL = "/reproduce/original"  # where the container sees OUTPUT_DIR (read-only)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """reproduce's own arguments, and the rest for run.py's options (--data, --env-file, -e, --image, --gpus...)."""
    parser = argparse.ArgumentParser(prog="run.py reproduce", allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("output_dir", type=Path, metavar="OUTPUT_DIR", help="a finished run's output folder")
    parser.add_argument("--steps", type=int, help="re-run only the first N steps (default: all)")
    parser.add_argument("--output", dest="new", type=Path, help="the new folder (default: OUTPUT_DIR-reproduce)")
    parser.add_argument("--replace", action="store_true", help="replace a non-empty --output")
    parser.add_argument("--allow-changed-data", action="store_true", help="run although a data file changed")
    parser.add_argument("--allow-other-gpus", action="store_true", help="run on other GPUs than the run recorded")
    wanted, rest = parser.parse_known_args(argv)
    folder = wanted.output_dir.expanduser().resolve()
    try:
        require(folder, "it cannot be reproduced exactly, run it again with this version")
    except ConfigError as exc:
        raise UserError(exc.message) from None
    wanted.output_dir = folder
    wanted.new = (wanted.new or folder.with_name(f"{folder.name}-reproduce")).expanduser().resolve()
    if wanted.new == folder or folder in wanted.new.parents:
        raise UserError(f"--output {wanted.new}: give a folder outside {folder} (the run is mounted read-only)")
    if not wanted.new.parent.is_dir():
        raise UserError(f"--output {wanted.new}: its parent folder does not exist")
    return wanted, rest


def recorded_image(folder: Path) -> dict[str, str | None]:
    """{"reference", "id"} of the image the run recorded; UserError for a run made outside any image."""
    provenance = read(folder) or {}
    image = provenance.get("image")
    if not isinstance(image, dict) or not (image.get("reference") or image.get("id")):
        raise UserError(
            f"{folder / PROVENANCE_FILE} names no image: the run was made outside any trainkit image. Reproduce it "
            "where it ran with `python -m trainer reproduce`, or give --image REF to run it in an image"
        )
    return {"reference": image.get("reference"), "id": image.get("id")}


def choose_image(folder: Path, override: str | None, client: docker.DockerClient, log: Callable[[str], None]) -> str:
    """The image to run: --image, else the recorded digest (here, or pulled), else the recorded image id."""
    if override:
        return override
    recorded = recorded_image(folder)
    reference, image_id = recorded["reference"] or "", recorded["id"]
    if DIGEST_REF.match(reference):
        if present(client, reference):
            return reference
        log(f"pulling {reference}, the image the run recorded")
        repository, digest = reference.split("@", 1)
        try:
            client.images.pull(repository, tag=digest)
            return reference
        except APIError as exc:
            raise UserError(
                f"the run's image {reference} is not on this engine and cannot be pulled "
                f"({exc.explanation or exc}): make the registry {repository.split('/')[0]} reachable (`docker "
                "login` if it needs one), load the image, or give --image REF to run another one"
            ) from None
    if reference and present(client, reference) and client.images.get(reference).id == image_id:
        return reference  # a local build, still under its tag
    if image_id and present(client, image_id):
        return image_id  # the same bytes, whatever the tag names now
    raise UserError(
        f"the run's image {reference or '(no reference)'} (id {image_id}) is not on this engine, and the run "
        "recorded no registry digest to pull it by (it was a local build): give --image REF (the comparison then "
        "names what differs), or push images to a registry and run from there"
    )


def present(client: docker.DockerClient, reference: str) -> bool:
    try:
        client.images.get(reference)
    except ImageNotFound:
        return False
    return True


def recorded_gpus(folder: Path) -> str:
    """`none` for a run made on the CPU (its re-run must be too), else `all`."""
    accelerator = (read(folder) or {}).get("accelerator") or {}
    return "all" if accelerator.get("gpus") else "none"


def container_command(wanted: argparse.Namespace) -> list[str]:
    command = ["reproduce", ORIGINAL, "--output", f"/output/{wanted.new.name}"]
    if wanted.steps is not None:
        command += ["--steps", str(wanted.steps)]
    flags = {"--replace": wanted.replace, "--allow-changed-data": wanted.allow_changed_data,
             "--allow-other-gpus": wanted.allow_other_gpus}  # fmt: skip
    return command + [flag for flag, given in flags.items() if given]


def mounts(wanted: argparse.Namespace) -> dict[str, dict[str, str]]:
    """OUTPUT_DIR read-only at ORIGINAL; NEW's parent at /output is run.py's --output (set by the caller)."""
    return {str(wanted.output_dir): {"bind": ORIGINAL, "mode": "ro"}}
