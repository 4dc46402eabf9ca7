"""The model's tool calls, made safely: what TRL's tool loop calls in place of the user's tools and environment
methods (trainer.run.multi_turn wraps each one before the loop runs).

Each call is checked first: the arguments the model wrote against the tool's signature and type hints (a name it
does not take, one it needs and lacks, a value of the wrong type: JSON's str, int, float, bool, null, lists and
objects against str, int, float, bool, None, list[X], dict[K, V], Optional/Union and Literal; other hints are the
tool's to check). Then the tool runs, in this process, as a Python call (no shell, no subprocess: trainkit never
starts one for a tool), bounded by TRAIN_RL_TOOL_TIMEOUT (trainer.run.user_code; async tools by asyncio's timeout).
Whatever goes wrong (a refused argument, an exception, the time limit) becomes a ToolError whose text the model reads
as the tool's result (TRL's `{"error": ...}`), and the step goes on; TRL counts it as a failed call, a timeout is
counted here too (`CallCounts`). After SIGTERM/SIGINT the step's tool calls share one grace (STOP_GRACE_S from the
signal): a call still running at its end is ended like a timeout and later ones are not made, so the step finishes
and its checkpoint is written within the bound (trainer.run.signals stops the run after it).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import threading
import time
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainer.run.user_code import STOP_GRACE_S, TimeUp, time_limit

log = logging.getLogger("trainer")
JSON_TYPES = {str: "str", int: "int", float: "float", bool: "bool", type(None): "None", list: "list", dict: "dict"}


class ToolError(Exception):
    """A tool call that did not give a result: its text is what the model reads instead."""


@dataclass
class CallCounts:
    """What the tool calls of one generation did besides TRL's own counts (calls, failures)."""

    timeouts: int = 0  # ended by the time limit or by a stop (or not made after the stop's grace)
    stopped: int = 0  # of those, because of a stop
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_timeout(self, by_stop: bool) -> None:
        with self._lock:  # async tools count from TRL's event-loop thread
            self.timeouts += 1
            self.stopped += int(by_stop)


def guarded(name: str, tool: Callable[..., Any], timeout: float, counts: CallCounts) -> Callable[..., Any]:
    """`tool` as the tool loop calls it: arguments checked, the call bounded, every failure a ToolError."""
    if inspect.iscoroutinefunction(tool):

        async def call_async(**arguments: Any) -> Any:
            _check(name, tool, arguments)
            try:
                return await asyncio.wait_for(tool(**arguments), timeout or None)
            except TimeoutError:
                counts.add_timeout(False)
                raise ToolError(f"{name} did not return within {timeout:g} s and was ended") from None
            except Exception as exc:  # the user's code: the model reads what went wrong
                raise ToolError(f"{name} raised {type(exc).__name__}: {exc}") from None

        return call_async

    def call(**arguments: Any) -> Any:
        _check(name, tool, arguments)
        grace = _grace_left()
        if grace is not None and grace <= 0:
            counts.add_timeout(True)
            raise ToolError(f"{name} was not called: the run is stopping")
        try:
            with time_limit(timeout, STOP_GRACE_S if grace is None else grace) as stopped:
                return tool(**arguments)
        except TimeUp:
            counts.add_timeout(bool(stopped))
            if stopped:
                log.warning("tools: %s was still running %g s after the stop signal: ended, so the step can finish "
                            "and be checkpointed", name, STOP_GRACE_S)  # fmt: skip
                raise ToolError(f"{name} was ended: the run is stopping") from None
            raise ToolError(f"{name} did not return within {timeout:g} s and was ended") from None
        except Exception as exc:  # the user's code: the model reads what went wrong
            raise ToolError(f"{name} raised {type(exc).__name__}: {exc}") from None

    return call


def _grace_left() -> float | None:
    """Seconds left of the grace the tool calls share after a stop signal; None: no stop came."""
    from trainer.run.signals import requested_at

    at = requested_at()
    return None if at is None else STOP_GRACE_S - (time.monotonic() - at)


def _check(name: str, tool: Callable[..., Any], arguments: Any) -> None:
    problem = argument_problem(tool, arguments)
    if problem:
        raise ToolError(f"{name} was not called: {problem}")


def argument_problem(tool: Callable[..., Any], arguments: Any) -> str | None:
    """What is wrong with the model's `arguments` for `tool` (its signature and type hints), or None."""
    if not isinstance(arguments, dict):
        return f"its arguments must be a JSON object, not {type(arguments).__name__}"
    parameters, hints = _signature(tool)
    named = {n: p for n, p in parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    if not any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        unknown = [k for k in arguments if k not in named]
        if unknown:
            return f"it takes no argument {unknown[0]!r} (its arguments: {', '.join(named) or 'none'})"
    missing = [n for n, p in named.items() if p.default is p.empty and n not in arguments]
    if missing:
        return f"the argument {missing[0]!r} is missing"
    for key, value in arguments.items():
        hint = hints.get(key)
        if hint is not None and not fits(value, hint):
            return f"the argument {key!r} must be {spoken(hint)}, not {value!r} ({type(value).__name__})"
    return None


@functools.lru_cache(maxsize=256)
def _signature(tool: Callable[..., Any]) -> tuple[dict[str, inspect.Parameter], dict[str, Any]]:
    """(parameters, resolved type hints) of a tool, once per tool (a bound method: its function's)."""
    parameters = dict(inspect.signature(tool).parameters)
    try:
        hints = typing.get_type_hints(getattr(tool, "__func__", tool))
    except Exception:  # an annotation that does not resolve: TRL's schema check named it before training
        hints = {}
    return parameters, hints


def fits(value: Any, hint: Any) -> bool:
    """Whether a JSON value (str, int, float, bool, None, list, dict) is of the type `hint` says."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is typing.Any or hint is inspect.Parameter.empty:
        return True
    if hint is None or hint is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, a) for a in args)
    if origin is typing.Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if hint in (bool, str):
        return isinstance(value, hint)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is list or origin is list:
        return isinstance(value, list) and all(fits(v, args[0]) for v in value) if args else isinstance(value, list)
    if hint is dict or origin is dict:
        return isinstance(value, dict) and (not args or all(fits(v, args[1]) for v in value.values()))
    if hint is tuple or origin is tuple:
        return isinstance(value, list)
    return True  # another class (a TypedDict, a model): JSON cannot hold it as such; the tool checks it


def spoken(hint: Any) -> str:
    """A type as the model is told it: str, int, list[int], str | None, one of 'a', 'b'."""
    if typing.get_origin(hint) is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if hint in JSON_TYPES:
        return JSON_TYPES[hint]
    return str(hint).replace("typing.", "")
