"""How a user's values enter generated job files: inert, and read back exactly as given.

- Shell (Slurm scripts, secrets files): every value goes through `sh` (one single-quoted word, shlex.quote), never
  inside double quotes or a here-document, so `$(...)`, backticks, `;`, `${VAR}`, quotes and newlines stay text.
- Comments (shell and YAML): `comment` escapes line breaks and other control characters, so a value cannot end
  the comment line and start a command or a YAML key.
- `#SBATCH` directives are read by sbatch, not by the shell, and have no quoting that keeps every character:
  `sbatch_value` refuses whitespace, quotes, backslashes and control characters (exit 2 naming the option).
- Names of variables are shell identifiers (`identifier`); mount lists cannot hold their own separators.
- YAML (Kubernetes): the manifest is serialised by the yaml library (scripts/cluster_k8s.py), never formatted in.
"""

from __future__ import annotations

import re
import shlex

from errors import UserError, exit_missing_package

try:
    from trainer.secrets import mask_value
except ModuleNotFoundError as missing:
    exit_missing_package(missing)

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SBATCH_UNSAFE = re.compile(r"[\s\"'\\\x00-\x1f\x7f]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029\x85]")
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(  # the distribution reference grammar: [host[:port]/]path[:tag][@digest]
    rf"(?:(?:localhost|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+|[A-Za-z0-9-]+:[0-9]+|[A-Za-z0-9.-]+:[0-9]+)/)?"
    rf"{_COMPONENT}(?:/{_COMPONENT})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?(?:@sha256:[0-9a-f]{{64}})?"
)


def sh(value: object) -> str:
    """`value` as one shell word that the shell reads back exactly (no expansion of any kind)."""
    return shlex.quote(str(value))


def comment(text: object) -> str:
    """`text` fit for a `# ...` line: line breaks and control characters shown escaped (\\n, \\x1b), never raw."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))


def sbatch_value(value: object, option: str) -> str:
    """A value for an `#SBATCH --option=value` line; a UserError for one sbatch cannot read back as given."""
    text = str(value)
    bad = _SBATCH_UNSAFE.search(text)
    if bad:
        raise UserError(
            f"{option} {mask_value(text)!r}: {bad.group()!r} cannot be written into an #SBATCH line (sbatch reads "
            "these lines itself, with no quoting that keeps it); use a value without whitespace, quotes, backslashes "
            "or control characters."
        )
    return text


def identifier(name: str, where: str) -> str:
    """A variable name the job can export; a UserError for one the shell cannot."""
    if not _IDENTIFIER.fullmatch(name):
        raise UserError(
            f"{where}: {name!r} is not a variable name a job can set (letters, digits and '_', not starting with a "
            "digit); rename it."
        )
    return name


def mount_path(path: str, option: str) -> str:
    """A host path for pyxis' --container-mounts / Apptainer's --bind, whose lists use ',' and ':' as separators."""
    if "," in path or ":" in path or _CONTROL.search(path):
        raise UserError(
            f"{option} {mask_value(path)!r}: pyxis and Apptainer mount lists cannot hold ',', ':' or control "
            "characters in a path; use a path (or a symlink to it) without them."
        )
    return path


def image_reference(image: str) -> str:
    """An image reference (registry/name:tag or @sha256:digest); a UserError for anything else. pyxis' squashfs
    files (.sqsh, a path) are paths, not references."""
    if image.endswith((".sqsh", ".squashfs")) or image.startswith("/"):
        if _CONTROL.search(image) or "," in image:
            shown = mask_value(image)
            raise UserError(f"--image {shown!r}: use a squashfs path without ',' or control characters.")
        return image
    if not _IMAGE.fullmatch(image):
        raise UserError(
            f"--image {mask_value(image)!r}: not an image reference; use REGISTRY/NAME:TAG or NAME@sha256:DIGEST "
            "(lowercase name), e.g. ghcr.io/org/trainkit:0.1.0-cu128."
        )
    return image
