"""`run.py serve OUT`: the server inside the container listens on every interface of the container, and the engine
publishes its port on this machine at the address serve's --host names (127.0.0.1 unless given: this machine only),
so the URL serve prints reaches it from here. Used by scripts/run.py."""

from __future__ import annotations

from errors import UserError

DEFAULT_PORT = 8000  # trainer/serve/command.py's (scripts/ never imports the trainer's command modules)
INSIDE = "0.0.0.0"  # the container's own interfaces; the engine publishes the port on --host


def _option(command: list[str], name: str) -> tuple[str | None, list[str]]:
    """The value of `name` in the command (--name V or --name=V), and the command without it."""
    rest, value, skip = [], None, False
    for n, word in enumerate(command):
        if skip:
            skip = False
        elif word == name:
            if n + 1 >= len(command):
                raise UserError(f"serve {name}: give a value")
            value, skip = command[n + 1], True
        elif word.startswith(f"{name}="):
            value = word.split("=", 1)[1]
        else:
            rest.append(word)
    return value, rest


def published(command: list[str]) -> tuple[list[str], dict[int, tuple[str, int]]]:
    """serve's command with --host 0.0.0.0, and the port binding {PORT: (HOST, PORT)} for the engine (the SDK takes
    the container's port as a number: "PORT/tcp" would be exposed as PORT/tcp/tcp and never published)."""
    host, rest = _option(command, "--host")
    port_text, _ = _option(command, "--port")
    try:
        port = int(port_text) if port_text else DEFAULT_PORT
    except ValueError:
        raise UserError(f"serve --port {port_text}: give a number") from None
    return [*rest, "--host", INSIDE], {port: (host or "127.0.0.1", port)}
