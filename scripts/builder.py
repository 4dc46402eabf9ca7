"""The engine side of build.py: base, BuildKit build, versions read inside the image, record, push."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import base_check
import docker
import image_labels
import registry
from buildkit import BuildFailed, BuildSpec, run_build
from cpu_base import BASE_FROM_LABEL, ensure_cpu_base, image_exists
from engine import connect
from errors import UserError
from matrix import ROOT, Matrix
from rich.console import Console
from standin_base import ensure_standin_base

STEP = re.compile(r"^#\d+ \[(?P<name>[^\]]+)\] (?P<what>.*)$")
console = Console(stderr=True)
RECORDS_DIR = ROOT / "build" / "records"
HOST_WHEEL = ROOT / "images" / "host-wheel"  # the context folder the Dockerfile's llama.cpp step reads a wheel from


class Progress:
    """Shows the current build step (a spinner on a terminal, one line per step otherwise)."""

    def __init__(self, title: str, verbose: bool = False):
        self.title = title
        self.verbose = verbose
        self.seen: set[str] = set()
        self.status = console.status(title) if console.is_terminal and not verbose else None

    def __enter__(self) -> Progress:
        if self.status:
            self.status.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.status:
            self.status.__exit__(*exc)

    def line(self, text: str) -> None:
        if self.verbose:
            print(text, file=sys.stderr, flush=True)
            return
        match = STEP.match(text)
        if not match or text in self.seen:
            return
        self.seen.add(text)
        step = f"[{match['name']}] {' '.join(match['what'].split())[:110]}"
        if self.status:
            self.status.update(f"{self.title}: {step}")
        else:
            print(f"  {step}", file=sys.stderr, flush=True)


def base_reference(client: docker.DockerClient, image: str) -> dict:
    """The base's id and registry digest, pulling it when it is not local."""
    if not image_exists(client, image):
        console.print(f"pulling {image} ...")
        try:
            client.images.pull(image)
        except docker.errors.APIError as exc:
            raise UserError(
                f"cannot pull the base image {image}: {exc.explanation or exc}.\n"
                "  NGC images need access to nvcr.io (behind a proxy: configure the engine's proxy and trust its CA;"
                " `docker login nvcr.io` for private tags), or load it with `docker load`."
            ) from None
    attrs = client.images.get(image).attrs
    digests = attrs.get("RepoDigests") or []
    made_from = ((attrs.get("Config") or {}).get("Labels") or {}).get(BASE_FROM_LABEL)  # the CPU base's own origin
    return {"image": image, "id": attrs["Id"], "digest": digests[0] if digests else None, "from": made_from}


def read_inside(client: docker.DockerClient, tag: str) -> dict:
    """Run the image's own verifier: manifest, versions and checks as it sees them."""
    try:
        out = client.containers.run(tag, ["/opt/trainkit/images/verify.py", "--json"], entrypoint="python",
                                    remove=True, stdout=True, stderr=False)  # fmt: skip
        return json.loads(out.decode())
    except (docker.errors.ContainerError, json.JSONDecodeError) as exc:
        raise BuildError(f"{tag} was built but its verifier could not report from inside: {exc}") from None


def skipped_pieces(manifest: dict) -> list[dict]:
    skipped = []
    for piece, claim in manifest.get("extensions", {}).items():
        if claim.get("status") == "skipped":
            skipped.append({"piece": piece, "reason": claim.get("reason", "")})
        for op, state in claim.get("ops", {}).items():
            if state.get("status") == "skipped":
                skipped.append({"piece": f"{piece}:{op}", "reason": state.get("reason", "")})
    return skipped


def build_record(labels: dict[str, str]) -> dict[str, str]:
    """The build argument TRAINKIT_BUILD: the labels as JSON, written into the image as /opt/trainkit/build.json
    for each run's provenance (the creation time left out, so a rebuild of the same source reuses the layer)."""
    kept = {key: value for key, value in labels.items() if key != "org.opencontainers.image.created"}
    return {"TRAINKIT_BUILD": json.dumps(kept, sort_keys=True)}


def stage_host_wheel(plan, matrix: Matrix) -> str:
    """For the CPU flavor, the host's llama-cpp-python wheel of [llama_cpp]'s pins (scripts/setup_llama_cpp.py's
    cache) into images/host-wheel/, where the build takes it when it matches the image (same Python, Debian, machine:
    the CPU base is the host's kind); other builds get the folder empty, so their layer's cache key stays put."""
    from setup_llama_cpp import default_cache, wheel_folder

    for old in HOST_WHEEL.iterdir():
        if old.name != "README.md":
            old.unlink()
    if plan.flavor != "cpu":
        return "none placed (only the CPU flavor takes the host's wheel)"
    folder = wheel_folder(default_cache() / matrix.llama_cpp["version"], matrix.llama_cpp["cmake_args"])
    stamp = folder / "build.json"
    if not stamp.is_file():
        return f"none placed (no wheel in {folder}: scripts/setup_llama_cpp.py makes one)"
    wheel = folder / json.loads(stamp.read_text())["wheel"]
    for path in (wheel, stamp):
        shutil.copy2(path, HOST_WHEEL / path.name)
    return f"placed {wheel.name} from {folder}"


def build_image(plan, matrix: Matrix, args: argparse.Namespace, ca: Path | None, make_labels: Callable) -> dict:
    """Build, verify and record one plan; return the record."""
    client = connect()
    started = time.time()
    t0 = time.monotonic()
    if plan.flavor == "cpu" and not args.base:
        with Progress("making the CPU base", args.verbose) as progress:
            ensure_cpu_base(client, matrix.cpu, ca, progress.line, rebuild=args.rebuild_base)
    if plan.standin:
        with Progress(f"making the stand-in base for CUDA {plan.cuda}", args.verbose) as progress:
            ensure_standin_base(client, matrix, matrix.row(plan.cuda, plan.rl), ca, progress.line,
                                rebuild=args.rebuild_base)
    base = base_reference(client, plan.base_image)
    facts = base_check.read_base(client, plan.base_image)
    plan.torch = facts.torch  # what the image will report: guard-torch keeps the base's
    entry = base_check.checked_entry(matrix, plan, args)
    if entry is not None:
        try:
            console.print(base_check.check(entry, plan.base_image, facts))
        except UserError as exc:
            raise BuildError(str(exc)) from None
    t_base = time.monotonic() - t0
    host_wheel = stage_host_wheel(plan, matrix)
    labels = make_labels(plan, matrix, base["digest"] or base["id"])
    if base["from"]:  # a local base's name says nothing once the image is published: keep where it came from
        labels[BASE_FROM_LABEL] = base["from"]
    spec = BuildSpec(
        context=ROOT, dockerfile=ROOT / "Dockerfile", tags=plan.tags, args={**plan.build_args, **build_record(labels)},
        labels=labels, ca_cert=ca, no_cache=args.no_cache,
    )  # fmt: skip
    try:
        with Progress(f"building {plan.tags[0]}", args.verbose) as progress:
            build_s = run_build(spec, progress.line)
    except BuildFailed as exc:
        tail = "\n".join(exc.tail[-40:])
        hint = ""
        if "CERTIFICATE_VERIFY_FAILED" in "\n".join(exc.tail):
            hint = ("\n  TLS verification failed inside the build: behind a TLS-inspecting proxy, pass its CA with "
                    "--ca-cert FILE (or TRAINKIT_CA_CERT).")
        raise BuildError(f"building {plan.tags[0]} failed; the end of the build output:\n{tail}{hint}") from None
    t1 = time.monotonic()
    inside = read_inside(client, plan.tags[0])
    image_labels.relabel(client, plan.tags[0], image_labels.truthful(spec.labels, inside), plan.tags)
    verify_s = time.monotonic() - t1
    image = client.images.get(plan.tags[0]).attrs
    record = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "inputs": {"build_args": plan.build_args, "no_cache": args.no_cache, "ca_cert_given": ca is not None},
        "base": base,
        "image": {
            "id": image["Id"],
            "tags": plan.tags,
            "size_bytes": image["Size"],
            "base_size_bytes": client.images.get(base["id"]).attrs["Size"],
        },
        "labels": image["Config"].get("Labels") or {},
        "versions_inside": inside["versions"],
        "manifest": inside["manifest"],
        "checks": inside["checks"],
        "vllm_server_mode": inside.get("vllm_server_mode", "unknown"),
        # which path the llama.cpp step took (the host's wheel or the sdist compiled) and the wheel's sha256
        "llama_cpp": {**inside["manifest"].get("extensions", {}).get("llama_cpp", {}), "host_wheel": host_wheel},
        "skipped": skipped_pieces(inside["manifest"]),
        "durations": {
            "base_s": round(t_base, 1),
            "build_s": round(build_s, 1),
            "verify_s": round(verify_s, 1),
            "total_s": round(time.monotonic() - t0, 1),
        },
    }
    if args.push:
        record["pushed"] = registry.push(client, plan.tags)
    write_record(plan, record)
    return record


def write_record(plan, record: dict) -> Path:
    RECORDS_DIR.mkdir(parents=True, exist_ok=True)
    # The whole tag, registry included: a pushed build must not overwrite the local build's record.
    path = RECORDS_DIR / (re.sub(r"[^A-Za-z0-9_.-]+", "-", plan.tags[0].replace(":", "_")) + ".json")
    record["record_path"] = str(path.relative_to(ROOT))
    record["plan"] = asdict(plan)
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


class BuildError(UserError):
    """A build that failed: reported like a user error (message, no traceback) but exits 1."""
