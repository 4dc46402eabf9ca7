"""The one .env parser, python-dotenv: it reads a .env the way docker compose does.

`export NAME=value`, single or double quotes, `NAME = value`, inline ` # comments`, CRLF line ends,
multi-line quoted values and `${OTHER}` from earlier lines or the environment. `NAME` alone takes the
value from the environment (and is left out when it is not set there), as compose's env_file does.
Used by scripts/run.py and scripts/cluster.py; torch-free and docker-free.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from pathlib import Path

from dotenv import dotenv_values
from dotenv.parser import parse_stream


class EnvFileError(ValueError):
    """A .env that cannot be read or parsed; the message names the file and line."""


def read_env_file(path: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """NAME -> value for every assignment in `path`, in file order."""
    environ = os.environ if environ is None else environ
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EnvFileError(f"{path}: cannot read it ({exc}).") from None
    for binding in parse_stream(io.StringIO(text)):
        if binding.error:
            # only the part before '=' is shown: a malformed line may hold a secret value
            shown = binding.original.string.split("=", 1)[0].strip()[:40]
            raise EnvFileError(
                f"{path}:{binding.original.line}: cannot parse {shown!r}; expected NAME=value "
                "(quote values with spaces or '#', e.g. NAME=\"a b\")."
            )
    values = dotenv_values(path, encoding="utf-8", interpolate=True)
    parsed: dict[str, str] = {}
    for name, value in values.items():
        if value is not None:
            parsed[name] = value
        elif name in environ:
            parsed[name] = environ[name]
    return parsed
