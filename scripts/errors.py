"""What host scripts tell a user who made a mistake: a UserError is printed without a traceback and exits 2.

No docker SDK here: pure-data modules (matrix.py, driver.py) raise UserError without pulling in the engine client.
"""

from __future__ import annotations

import sys


class UserError(Exception):
    """A mistake the user can fix; scripts print it without a traceback and exit 2."""


def exit_missing_package(exc: ModuleNotFoundError) -> None:
    """For a script's imports of this project's own torch-free modules (trainer.envfile, trainer.secrets...)."""
    print(
        f"error: cannot import {exc.name!r}: install the host tools from the repository with "
        "`pip install -e '.[host]'` (scripts/quickstart.sh does), then retry.",
        file=sys.stderr,
    )
    sys.exit(2)


def key_values(items: list[str], option: str) -> dict[str, str]:
    """['K=V', ...] given with `option` -> {K: V}; a UserError naming the item that is not KEY=VALUE."""
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"{option} {item!r}: use KEY=VALUE.")
        pairs[key] = value
    return pairs


def exit_on_user_error(main):
    """Decorator for script entry points: UserError -> message on stderr, exit 2."""

    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)

    wrapper.__name__ = main.__name__
    wrapper.__doc__ = main.__doc__
    return wrapper
