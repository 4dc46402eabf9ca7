"""The image a run uses: chosen by the GPU rule, found on the engine, pulled (pinned by digest, or the published
image of a row) or built with scripts/build.py. Used by scripts/run.py."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Callable

import docker
import published
from devices import engine_has_gpus
from docker.errors import APIError, ImageNotFound
from driver import auto_entry
from errors import UserError
from matrix import CPU_RL_ROW, ROOT, default_image, is_cpu_image, load
from registry import DIGEST_REF


def choose_image_and_gpus(args: argparse.Namespace, client: docker.DockerClient, log: Callable[[str], None],
                          vllm: bool = False) -> tuple[str, str]:  # fmt: skip
    """(image, --gpus) by the image rule (run.py's docstring); `vllm`: the run sets TRAIN_RL_ENGINE=vllm."""
    gpus = args.gpus
    if gpus == "auto":
        gpus = "all" if engine_has_gpus(client) and not is_cpu_image(args.image or "") else "none"
    cuda = args.cuda
    if cuda == "auto" and gpus != "none" and not args.image:
        entry, why = auto_entry(load())
        log(why)
        cuda = entry.cuda
    image = args.image or default_image(gpu=gpus != "none", cuda=cuda, vllm=vllm)
    if vllm and not args.image and gpus == "none":
        log(f"TRAIN_RL_ENGINE=vllm without a GPU: {image}, the CPU flavor's online-RL image (vLLM's CPU build)")
    return image, gpus


def build_command(image: str) -> list[str] | None:
    """The scripts/build.py command that makes `image`, when it is one of ours."""
    repository, _, tag = image.rpartition(":")
    if repository.rsplit("/", 1)[-1] != "trainkit":
        return None
    if tag.endswith("cpu"):
        return ["python", "scripts/build.py", "--cpu"]
    if tag.endswith(CPU_RL_ROW):
        return ["python", "scripts/build.py", "--cpu", "--rl"]
    match = re.search(r"cu(\d+)(\d)", tag)
    return ["python", "scripts/build.py", "--cuda", f"{match[1]}.{match[2]}"] if match else None


def ensure_image(client: docker.DockerClient, image: str, build_if_missing: bool, log: Callable[[str], None]) -> None:
    try:
        client.images.get(image)
        return
    except ImageNotFound:
        pass
    if DIGEST_REF.match(image):  # pinned bytes: fetch exactly those
        log(f"pulling {image}")
        repository, digest = image.split("@", 1)
        try:
            client.images.pull(repository, tag=digest)
        except APIError as exc:
            raise UserError(f"cannot pull {image}: {exc.explanation or exc}") from None
        return
    command = build_command(image)
    if command is None:
        raise UserError(f"image {image} is not on this engine: `docker pull {image}` or build it")
    if published.pull_published(client, image, load(), log):
        return
    if not build_if_missing:
        cpu_hint = "" if "--cpu" in command else " Without GPUs: `python scripts/build.py --cpu` and `--gpus none`."
        raise UserError(
            f"image {image} is not on this engine. Build it with `{' '.join(command)}` "
            f"(or add --build-if-missing).{cpu_hint}"
        )
    log(f"image {image} is missing: running `{' '.join(command)}`; {published.first_build_note(image, load())}")
    result = subprocess.run([sys.executable, *command[1:]], cwd=ROOT, check=False)
    if result.returncode != 0:
        raise UserError(f"building {image} failed (exit {result.returncode}); see the build output above")
    try:
        client.images.get(image)
    except ImageNotFound:
        raise UserError(
            f"`{' '.join(command)}` succeeded but made no {image}: pick one of the tags it printed with --image"
        ) from None
