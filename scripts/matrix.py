"""The version matrix in images/versions.toml, and everything generated from it.

`python scripts/generate.py` writes the derived text (the Dockerfile's ARG defaults, the tables in
docs/images.md and README.md) from here; `python scripts/matrix.py` prints the table.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import tomllib
from engine import UserError

ROOT = Path(__file__).resolve().parent.parent
VERSIONS_FILE = ROOT / "images" / "versions.toml"
DOCKERFILE = ROOT / "Dockerfile"
IMAGES_DOC = ROOT / "docs" / "images.md"
REPOSITORY = "trainkit"
NGC_REPOSITORY = "nvcr.io/nvidia/pytorch"
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
    unsupported: dict[str, str] = field(default_factory=dict)  # TRAIN_X=value -> why this row's stack cannot run it

    @property
    def cuda_tag(self) -> str:
        """`cu128` for CUDA 12.8."""
        return "cu" + self.cuda.replace(".", "")

    @property
    def base_image(self) -> str:
        return f"{NGC_REPOSITORY}:{self.ngc}-py3"


@dataclass(frozen=True)
class CpuFlavor:
    debian_suite: str
    debian_mirror: str
    python: str
    torch: str
    torch_index: str
    packages: dict[str, str]

    @property
    def base_image(self) -> str:
        return f"trainkit-base:cpu-{self.debian_suite}-py{self.python}-torch{self.torch}"


@dataclass(frozen=True)
class Matrix:
    version: str
    default_cuda: str
    packages: dict[str, str]
    apex: dict[str, str]
    flash_attn_wheel_url: str
    cpu: CpuFlavor
    entries: dict[str, Entry] = field(default_factory=dict)

    def entry(self, cuda: str) -> Entry:
        """The entry for CUDA `cuda` (X.Y), or a UserError listing the supported ones."""
        if cuda not in self.entries:
            raise UserError(
                f"CUDA {cuda!r} is not in the matrix; supported: {', '.join(self.entries)}.\n"
                "  Pick one of these with --cuda, or add an entry to images/versions.toml."
            )
        return self.entries[cuda]

    def entry_for_ngc(self, ngc: str) -> Entry | None:
        """The entry whose base is NGC release `ngc` (YY.MM), if any."""
        return next((e for e in self.entries.values() if e.ngc == ngc), None)


def load(path: Path = VERSIONS_FILE) -> Matrix:
    """Parse versions.toml; entries' package pins already merged over the defaults."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    defaults = dict(data["packages"])
    entries = {
        cuda: Entry(cuda=cuda, **{**raw, "packages": {**defaults, **raw.get("packages", {})}})
        for cuda, raw in data["cuda"].items()
    }
    cpu = CpuFlavor(**data["cpu"], packages=defaults)
    return Matrix(
        version=data["version"],
        default_cuda=data["default_cuda"],
        packages=defaults,
        apex=dict(data["apex"]),
        flash_attn_wheel_url=data["flash_attn"]["wheel_url"],
        cpu=cpu,
        entries=entries,
    )


def qualify(tag: str, registry: str | None) -> str:
    return f"{registry.rstrip('/')}/{tag}" if registry else tag


def cuda_tags(matrix: Matrix, entry: Entry, ngc: str | None = None, registry: str | None = None) -> list[str]:
    """Immutable tag first, then the moving one."""
    immutable = f"{REPOSITORY}:{matrix.version}-{entry.cuda_tag}-ngc{ngc or entry.ngc}"
    moving = f"{REPOSITORY}:latest-{entry.cuda_tag}"
    return [qualify(immutable, registry), qualify(moving, registry)]


def cpu_tags(matrix: Matrix, registry: str | None = None) -> list[str]:
    return [qualify(f"{REPOSITORY}:{matrix.version}-cpu", registry), qualify(f"{REPOSITORY}:latest-cpu", registry)]


def default_image(gpu: bool) -> str:
    """The moving tag a user gets without choosing: the default CUDA entry, or the CPU flavor."""
    matrix = load()
    if not gpu:
        return cpu_tags(matrix)[1]
    return cuda_tags(matrix, matrix.entry(matrix.default_cuda))[1]


def readme_table(matrix: Matrix | None = None) -> str:
    """The Markdown table of the matrix for docs/images.md."""
    matrix = matrix or load()
    rows = [
        "| CUDA | NGC base | torch | Python | Ubuntu | driver >= | in NGC | pins differing from default "
        "| not supported | tags |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for e in matrix.entries.values():
        shipped = ", ".join(k for k, v in e.includes.items() if v) or "-"
        overrides = ", ".join(f"{k} {v}" for k, v in e.packages.items() if matrix.packages.get(k) != v) or "-"
        mark = "" if e.verified else " (unverified)"
        default = " **default**" if e.cuda == matrix.default_cuda else ""
        tags = " ".join(f"`{t}`" for t in cuda_tags(matrix, e))
        rows.append(
            f"| {e.cuda}{default} | `{e.base_image}` | {e.torch} | {e.python}{mark} | {e.ubuntu} | {e.driver_min} "
            f"| {shipped} | {overrides} | {', '.join(f'`{k}`' for k in e.unsupported) or '-'} | {tags} |"
        )
    cpu = matrix.cpu
    rows.append(
        f"| CPU | `{cpu.base_image}` (built locally, Debian {cpu.debian_suite}) | {cpu.torch}+cpu | {cpu.python} "
        f"| - | - | - | - | - | {' '.join(f'`{t}`' for t in cpu_tags(matrix))} |"
    )
    return "\n".join(rows) + "\n"


def dockerfile_defaults(matrix: Matrix | None = None) -> dict[str, str]:
    """The Dockerfile ARG defaults: the default CUDA entry's base, arch list and pins."""
    matrix = matrix or load()
    entry = matrix.entry(matrix.default_cuda)
    args = {"BASE_IMAGE": entry.base_image, "TORCH_CUDA_ARCH_LIST": entry.arch_list}
    args.update({arg: entry.packages[pkg] for pkg, arg in PIN_ARGS.items()})
    args["APEX_REF"] = matrix.apex["ref"]
    args["FLASH_ATTN_WHEEL_URL"] = matrix.flash_attn_wheel_url
    return args


def compose_defaults(matrix: Matrix | None = None) -> dict[str, str]:
    """What a compose file's build section needs: the GPU image tag and the Dockerfile's defaults."""
    matrix = matrix or load()
    return {"image": default_image(gpu=True), **dockerfile_defaults(matrix)}


def dockerfile_arg_block(matrix: Matrix | None = None) -> str:
    lines = [f'ARG {name}="{value}"' for name, value in dockerfile_defaults(matrix).items()]
    return "\n".join(lines) + "\n"


BLOCKS = {
    DOCKERFILE: (
        "# BEGIN generated by scripts/matrix.py\n",
        "# END generated by scripts/matrix.py\n",
        dockerfile_arg_block,
    ),
    IMAGES_DOC: ("<!-- BEGIN matrix table (scripts/matrix.py) -->\n", "<!-- END matrix table -->\n", readme_table),
}


def regenerate(path: Path, matrix: Matrix) -> tuple[str, str]:
    """(current text, text with the generated block refreshed) for one derived file."""
    begin, end, render = BLOCKS[path]
    text = path.read_text()
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise UserError(f"{path} lacks the generated block markers {begin.strip()!r} ... {end.strip()!r}")
    return text, pattern.sub(lambda _m: begin + render(matrix) + end, text)


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__).parse_args(argv)
    print(readme_table(load()), end="")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
