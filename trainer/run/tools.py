"""TRAIN_RL_TOOLS and TRAIN_RL_ENVIRONMENT in the run: the user's tools and environment classes imported and checked
before the model loads, and what TRL's GRPOTrainer is handed for them (`tools`, `environment_factory`).

Checked here, each a ConfigError (exit 2) naming the file and what to fix: the file imports; each tool (a function,
or an environment's public method) has the type hints and the docstring TRL renders into the prompt (Transformers'
get_json_schema, the very function TRL's chat template call uses, must accept it); an environment class has a
callable `reset`; the chat template can render tools, tool calls and tool results, and parse the model's tool calls
back (TRL's own checks; the built-in chatml carries its parser, assets/chat_templates/chatml.response.json).

An environment is made by TRL (one instance per rollout, reused across batches). Its `reset` gets the record's
columns it takes (trainkit's record location left out), its `get_reward` must return a finite number: either
raising ends the run with exit 2 naming the class and the record, as a failing reward function does
(trainer.run.rewards). Its tool methods are guarded with the tools (trainer.run.tool_calls).
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.config.rl_tools import RESERVED, environment_sources, tool_sources
from trainer.data.prompts import WHERE
from trainer.errors import ConfigError
from trainer.run.metrics import finite_float
from trainer.run.rewards import RewardFailed
from trainer.run.user_code import import_file

log = logging.getLogger("trainer")


# ---- imported and checked ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Toolbox:
    """What TRL's GRPOTrainer is handed: `tools` and `environment_factory` (a class, or {name: class})."""

    tools: tuple[Any, ...] = ()
    environments: dict[str, type] | None = None

    @property
    def factory(self) -> Any:
        if not self.environments:
            return None
        made = {name: environment_factory(cls) for name, cls in self.environments.items()}
        return made.get("", made)

    def offered(self) -> list[Any]:
        """Every tool a prompt may describe: the functions and each environment's methods (as its class holds them:
        the description is the same as an instance's)."""
        methods = [types.MethodType(fn, cls) for cls in (self.environments or {}).values() for _, fn in
                   public_methods(cls)]  # fmt: skip
        return [*self.tools, *methods]

    def described(self) -> str:
        names = [t.__name__ for t in self.tools]
        for name, cls in (self.environments or {}).items():
            methods = ", ".join(n for n, _ in public_methods(cls)) or "no tools"
            names.append(f"{cls.__name__}{f' ({name!r})' if name else ''}: {methods}")
        return "; ".join(names)


def load_toolbox(tools: str, environment: str) -> Toolbox:
    """TRAIN_RL_TOOLS and TRAIN_RL_ENVIRONMENT imported and checked (see the module)."""
    found = []
    for source in tool_sources(tools):
        module = import_file(source.path, "TRAIN_RL_TOOLS")
        for name in source.names:
            function = getattr(module, name, None)
            if not inspect.isfunction(function):
                raise ConfigError(f"TRAIN_RL_TOOLS: {name} in {source.path} is not a function "
                                  f"({type(function).__name__})")  # fmt: skip
            check_schema(function, f"TRAIN_RL_TOOLS: the tool {name} in {source.path}")
            found.append(function)
    environments = {}
    for entry in environment_sources(environment):
        cls = getattr(import_file(entry.path, "TRAIN_RL_ENVIRONMENT"), entry.cls, None)
        if not inspect.isclass(cls):
            raise ConfigError(f"TRAIN_RL_ENVIRONMENT: {entry.cls} in {entry.path} is not a class "
                              f"({type(cls).__name__})")  # fmt: skip
        check_environment(cls, entry.path)
        environments[entry.name] = cls
    return Toolbox(tuple(found), environments or None)


def check_schema(tool: Any, who: str) -> None:
    """The JSON schema TRL renders into the prompt can be made from the tool (type hints and docstring)."""
    from transformers.utils import get_json_schema

    try:
        get_json_schema(tool)
    except Exception as exc:  # Transformers' TypeHintParsingException/DocstringParsingException, or worse
        raise ConfigError(
            f"{who}: {exc}. TRL describes each tool to the model from its signature and docstring: every argument "
            "needs a type hint, and the docstring a summary line and an `Args:` section naming each argument"
        ) from None


def public_methods(cls: type) -> list[tuple[str, Any]]:
    """An environment class's methods TRL offers as tools (as it lists them: the class's functions)."""
    return [(name, fn) for name, fn in inspect.getmembers(cls, predicate=inspect.isfunction)
            if name not in RESERVED and not name.startswith("_")]  # fmt: skip


def check_environment(cls: type, path: str) -> None:
    who = f"TRAIN_RL_ENVIRONMENT: {cls.__name__} in {path}"
    if not callable(getattr(cls, "reset", None)):
        raise ConfigError(f"{who} has no `reset` method; TRL calls reset(**record columns) to start each episode")
    for name, method in public_methods(cls):
        check_schema(types.MethodType(method, cls), f"{who}: its tool method {name}")


def environment_factory(cls: type) -> Any:
    """A factory of `cls` instances whose reset and get_reward fail named (see the module)."""

    def make() -> Any:
        try:
            instance = cls()
        except Exception as exc:  # the user's class
            raise ConfigError(f"TRAIN_RL_ENVIRONMENT: {cls.__name__}() raised {type(exc).__name__}: {exc}") from None
        instance.reset = _guarded_reset(cls, instance.reset)
        if callable(getattr(instance, "get_reward", None)):
            instance.get_reward = _guarded_reward(cls, instance.get_reward)
        return instance

    make.__name__ = cls.__name__
    return make


def _guarded_reset(cls: type, reset: Any) -> Any:
    parameters = inspect.signature(reset).parameters.values()
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters)
    accepted = {p.name for p in parameters}

    def guarded(**row: Any) -> Any:
        where = row.pop(WHERE, "?")
        given = row if takes_any else {k: v for k, v in row.items() if k in accepted}
        try:
            return reset(**given)
        except Exception as exc:  # the user's code: the run ends, named
            raise RewardFailed(f"TRAIN_RL_ENVIRONMENT: {cls.__name__}.reset raised {type(exc).__name__}: {exc} (on "
                               f"the record at {where})") from None  # fmt: skip

    return guarded


def _guarded_reward(cls: type, get_reward: Any) -> Any:
    def guarded() -> float:
        try:
            value = get_reward()
        except Exception as exc:  # the user's code: the run ends, named
            raise RewardFailed(f"TRAIN_RL_ENVIRONMENT: {cls.__name__}.get_reward raised {type(exc).__name__}: "
                               f"{exc}") from None  # fmt: skip
        number = finite_float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
        if number is None:
            raise RewardFailed(f"TRAIN_RL_ENVIRONMENT: {cls.__name__}.get_reward returned {value!r}; a reward is a "
                               "finite number")  # fmt: skip
        return number

    return guarded


# ---- the chat template -------------------------------------------------------------------------------------------


def check_template(tokenizer: Any, origin: str) -> None:
    """The tokenizer's chat template renders a whole tool exchange, keeps earlier turns as they were (TRL adds the tool
    results to the token ids it has), and the model's tool calls can be parsed back; else ConfigError naming it."""
    from trl.chat_template_utils import add_response_schema, is_chat_template_prefix_preserving, supports_tool_calling

    fix = ("use TRAIN_CHAT_TEMPLATE=chatml (trainkit's built-in, Hermes-style tool calls) or a model whose own "
           "template supports tools (Qwen2.5/3, Llama 3.1+, ...)")  # fmt: skip
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"TRAIN_RL_TOOLS/TRAIN_RL_ENVIRONMENT need a chat template and there is none ({origin}); "
                          f"{fix}")  # fmt: skip
    if not supports_tool_calling(tokenizer):
        raise ConfigError(f"the chat template ({origin}) cannot render tool calls and tool results (TRL renders a "
                          f"user -> assistant with tool_calls -> tool exchange and finds parts of it missing); {fix}")
    if not is_chat_template_prefix_preserving(tokenizer):
        raise ConfigError(f"the chat template ({origin}) renders an assistant turn differently once a tool result "
                          f"follows it, so the tokens the model generated could not stay as they were; {fix}")
    if getattr(tokenizer, "response_template", None) or getattr(tokenizer, "response_schema", None):
        return
    if tokenizer.chat_template == builtin("chatml.jinja"):
        tokenizer.response_template = json.loads(builtin("chatml.response.json"))
        return
    try:
        add_response_schema(tokenizer)
    except ValueError:
        raise ConfigError(f"the chat template ({origin}) is none TRL knows how to read tool calls back from (no "
                          f"response_template on the tokenizer); {fix}") from None  # fmt: skip


@functools.cache
def builtin(name: str) -> str:
    from trainer.data.chat import TEMPLATES_DIR

    return (Path(TEMPLATES_DIR) / name).read_text(encoding="utf-8")
