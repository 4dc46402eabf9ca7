"""The one .env parser: a .env means here what it means to `docker compose` (v2, compose-go's dotenv rules).

- `NAME=value`, `export NAME=value`, `NAME = value`, `NAME: value`; names of letters, digits, '_' and '.'.
- Unquoted: the rest of the line; ` #` (a space, then #) starts a comment; surrounding whitespace is dropped; no
  escapes (a backslash is a backslash); `$VAR`, `${VAR}` and the forms below are expanded.
- 'single-quoted': literal (no expansion, `\\n` stays two characters); only `\\'` stands for a quote; may span
  lines.
- "double-quoted": `\\n`, `\\r`, `\\t`, `\\\\`, `\\"` and `\\$` (a literal $) are escapes, any other backslash
  stays; `${VAR}` is expanded; may span lines.
- Expansion: `$VAR`, `${VAR}`, `${VAR:-default}`, `${VAR-default}`, `${VAR:+alt}`, `${VAR+alt}`, `${VAR:?error}`,
  `${VAR?error}`; `$$` is a literal $. A variable is looked up in the environment first, then in this file (a later
  line too: compose reads the project's .env once for itself before it reads it as the services' env_file); unset
  is empty.
- `NAME` alone takes the value from the environment, and is left out when it is not set there.
Text after a closing quote is read as the next statement, as compose does. tests/test_envfile.py holds this parser
to `docker compose config` on the same files. Used by scripts/run.py, scripts/cluster.py and the trainer's own
readers; torch-free and docker-free.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path

from trainer.secrets import mask_value

_SPACE = "\t\v\f\r \x85\xa0"  # compose's "space": whitespace that is not a line break
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
HINT = "expected NAME=value (quote a value with spaces or ' #', e.g. NAME=\"a b\")"
_DOUBLE_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "$": "$"}

Lookup = Callable[[str], "str | None"]


class EnvFileError(ValueError):
    """A .env that cannot be read or parsed; the message names the file and line."""


def read_env_file(path: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """NAME -> value for every assignment in `path`, in file order, as docker compose reads them."""
    environ = os.environ if environ is None else environ
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EnvFileError(f"{path}: cannot read it ({exc}).") from None
    project = _Parser(text, path, environ, {}, quiet=True).parse()  # compose's own read of the project .env
    return _Parser(text, path, environ, project).parse()


class _Parser:
    def __init__(self, text: str, path: Path, environ: Mapping[str, str], project: Mapping[str, str],
                 quiet: bool = False) -> None:  # fmt: skip
        self.text, self.path, self.environ, self.project, self.quiet = text, path, environ, project, quiet
        self.pos = 0
        self.out: dict[str, str] = {}

    def error(self, message: str, at: int | None = None) -> EnvFileError:
        line = self.text.count("\n", 0, self.pos if at is None else at) + 1
        return EnvFileError(f"{self.path}:{line}: {message}")

    def parse(self) -> dict[str, str]:
        while self._statement_start():
            start = self.pos
            name, inherited = self._name()
            if inherited:
                if name in self.environ:
                    self.out[name] = self.environ[name]
                continue
            self.out[name] = self._value(start)
        return self.out

    def _statement_start(self) -> bool:
        """Skip blank space and comment lines; False at the end of the file."""
        text = self.text
        while self.pos < len(text):
            if text[self.pos].isspace():
                self.pos += 1
            elif text[self.pos] == "#":
                end = text.find("\n", self.pos)
                self.pos = len(text) if end < 0 else end
            else:
                return True
        return False

    def _name(self) -> tuple[str, bool]:
        text = self.text
        if text.startswith("export", self.pos) and self.pos + 6 < len(text) and text[self.pos + 6] in _SPACE:
            self.pos += 6
            while self.pos < len(text) and text[self.pos] in _SPACE:
                self.pos += 1
        start = self.pos
        while self.pos < len(text):
            char = text[self.pos]
            if char in "=:\n":
                name = text[start : self.pos].rstrip()
                self.pos += 1
                if " " in name or "\t" in name:
                    shown = mask_value(name.split()[0][:40])  # the first word only: the rest may be a secret
                    raise self.error(f"'{shown} ...': a name cannot contain a space; {HINT}.", start)
                return name, char == "\n"
            if not (char in _SPACE or char in "_." or (char.isascii() and char.isalnum())):
                shown = mask_value(text[start : self.pos + 1][:40])  # the name only: a value may be a secret
                raise self.error(f"unexpected character {char!r} in the name {shown!r}; {HINT}.", start)
            self.pos += 1
        return text[start:].rstrip(), True  # a last line without '=' or line break

    def _value(self, start: int) -> str:
        text = self.text
        while self.pos < len(text) and text[self.pos] in _SPACE:
            self.pos += 1
        if self.pos < len(text) and text[self.pos] in "'\"":
            return self._quoted(text[self.pos], start)
        end = text.find("\n", self.pos)
        end = len(text) if end < 0 else end
        raw = text[self.pos : end]
        self.pos = end
        comment = raw.find(" #")
        raw = (raw if comment < 0 else raw[:comment]).rstrip()
        return self._expand(raw, start, escapes=False)

    def _quoted(self, quote: str, start: int) -> str:
        text = self.text
        i = self.pos + 1
        while i < len(text) and text[i] != quote:
            i += 2 if text[i] == "\\" else 1
        if i >= len(text):
            raise self.error("unterminated quoted value (a missing closing quote).", start)
        raw = text[self.pos + 1 : i]
        self.pos = i + 1
        if quote == "'":
            return raw.replace("\\'", "'")
        return self._expand(raw, start, escapes=True)

    def _lookup(self, name: str) -> str | None:
        for source in (self.environ, self.out, self.project):
            if name in source:
                return source[name]
        return None

    def _expand(self, raw: str, start: int, escapes: bool) -> str:
        out: list[str] = []
        i = 0
        while i < len(raw):
            char = raw[i]
            if escapes and char == "\\" and i + 1 < len(raw) and raw[i + 1] in _DOUBLE_ESCAPES:
                out.append(_DOUBLE_ESCAPES[raw[i + 1]])
                i += 2
            elif char == "$":
                text, i = self._variable(raw, i, start)
                out.append(text)
            else:
                out.append(char)
                i += 1
        return "".join(out)

    def _variable(self, raw: str, i: int, start: int) -> tuple[str, int]:
        """The text for the `$...` at raw[i] and the index after it."""
        nxt = raw[i + 1 : i + 2]
        if nxt == "$":
            return "$", i + 2
        if nxt != "{":
            match = _NAME.match(raw, i + 1)
            if not match:
                return "$", i + 1
            return self._lookup(match.group()) or "", match.end()
        close = _closing_brace(raw, i + 2)
        if close < 0:
            raise self.error("unterminated ${...} in a value.", start)
        body = raw[i + 2 : close]
        match = _NAME.match(body)
        if not match:
            raise self.error(f"invalid substitution ${{{mask_value(body[:40])}}}.", start)
        name, op, arg = match.group(), body[match.end() : match.end() + 2], ""
        if op[:1] in ("-", "+", "?"):
            op, arg = op[:1], body[match.end() + 1 :]
        elif op in (":-", ":+", ":?"):
            arg = body[match.end() + 2 :]
        elif body[match.end() :]:
            raise self.error(f"invalid substitution ${{{mask_value(body[:40])}}}.", start)
        else:
            op = ""
        return self._substitute(name, op, arg, start), close + 1

    def _substitute(self, name: str, op: str, arg: str, start: int) -> str:
        value = self._lookup(name)
        empty = not value
        if op in (":-", "-"):
            use_default = empty if op == ":-" else value is None
            return self._expand(arg, start, escapes=False) if use_default else value or ""
        if op in (":+", "+"):
            use_alt = not empty if op == ":+" else value is not None
            return self._expand(arg, start, escapes=False) if use_alt else ""
        if op in (":?", "?") and (empty if op == ":?" else value is None):
            if self.quiet:
                return ""
            reason = f": {arg}" if arg else ""
            raise self.error(f"required variable {name} is missing a value{reason}.", start)
        return value or ""


def _closing_brace(raw: str, i: int) -> int:
    """The index of the '}' that closes a '${' whose body starts at i (nested ${...} included), else -1."""
    depth = 1
    while i < len(raw):
        if raw.startswith("${", i):
            depth += 1
            i += 2
            continue
        if raw[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1
