"""trainkit's trainer: `python -m trainer`, configured by TRAIN_* environment variables.

Importing the package is cheap on purpose (no torch): bad configuration is reported before heavy imports.
"""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("trainkit")
except metadata.PackageNotFoundError:  # a source tree that is not pip-installed (e.g. /opt/trainkit)
    __version__ = "0+unknown"
