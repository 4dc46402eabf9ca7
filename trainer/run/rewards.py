"""TRAIN_REWARD's reward functions, as TRL's online trainers call them: (prompts, completions, **columns) -> one
number per completion.

Each entry of TRAIN_REWARD (trainer.config.online.rewards, the one parse) becomes a `Reward`: a built-in or the user's
function imported from its file; a reward model folder is loaded through trainer.model's one loader (a one-score
head) and handed to TRL as the model. A `Reward` is named as TRL logs it
(rewards/NAME/mean) and guards the call: a function that raises, returns something that is not one finite number
per completion, ends the run with a RewardFailed (exit 2) naming the function, the record (file:line) and the value,
never a traceback from inside TRL; the last checkpoint stays as it was.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.config.online import TRL_ARGUMENTS, Rewards, RewardSpec
from trainer.data.prompts import WHERE
from trainer.errors import ConfigError, Interrupted
from trainer.run.metrics import finite_float
from trainer.run.user_code import STOP_GRACE_S, TimeUp, import_file, time_limit

log = logging.getLogger("trainer")
# A prompt or a completion as TRL hands it to a reward: text, or for conversational data a list of messages.
Conversational = str | list[dict[str, object]]


class RewardFailed(ConfigError):
    """A reward function failed in training (exit 2, named)."""


def normalised(text: str) -> str:
    """Whitespace runs as one space, ends stripped, lower case: what `exact` and `contains` compare."""
    return " ".join(text.split()).lower()


def text_of(completion: Conversational) -> str:
    """A completion's text: TRL gives text, or for conversational prompts a list of messages: the last assistant
    turn's (in a multi-turn episode the answer after the tool calls and results, never a tool's output)."""
    if isinstance(completion, list):
        turns = [m for m in completion if isinstance(m, dict) and m.get("role", "assistant") == "assistant"]
        return str((turns[-1].get("content") if turns else "") or "")
    return str(completion)


def exact(prompts: list[Conversational], completions: list[Conversational], answer: list[object], **_: object
          ) -> list[float]:  # fmt: skip
    """1 where the completion, normalised, equals the record's `answer`, else 0."""
    return [float(normalised(text_of(c)) == normalised(str(a))) for c, a in zip(completions, answer, strict=True)]


def contains(prompts: list[Conversational], completions: list[Conversational], answer: list[object], **_: object
             ) -> list[float]:  # fmt: skip
    """1 where the record's `answer`, normalised, appears in the normalised completion, else 0."""
    return [float(normalised(str(a)) in normalised(text_of(c))) for c, a in zip(completions, answer, strict=True)]


def math(prompts: list[Conversational], completions: list[Conversational], answer: list[object], **_: object
         ) -> list[float]:  # fmt: skip
    """1 where the completion's final answer equals the record's `answer` as mathematics (math-verify: LaTeX,
    \\boxed{}, fractions, decimals, expressions: 1/2 = 0.5 = \\frac{1}{2}), else 0. An answer that holds no
    mathematics raises (the record is named)."""
    from math_verify import parse, verify

    return [float(verify(_gold(str(a)), parse(text_of(c)))) for c, a in zip(completions, answer, strict=True)]


@functools.lru_cache(maxsize=4096)
def _gold(answer: str) -> Any:
    """The record's answer parsed: as written (a number, `$...$`, `\\boxed{}`), else as bare LaTeX."""
    from math_verify import parse

    gold = parse(answer) or parse(f"${answer}$")
    if not any(not isinstance(value, str) for value in gold):  # only text: nothing to compare as mathematics
        raise ValueError(f"the answer {answer!r} holds no mathematics math-verify can read")
    return gold


def regex_reward(pattern: str) -> Any:
    compiled = re.compile(pattern)

    def regex(prompts: list[Conversational], completions: list[Conversational], **_: object) -> list[float]:
        """1 where the pattern matches the completion (re.search), else 0."""
        return [float(compiled.search(text_of(c)) is not None) for c in completions]

    return regex


def length_reward(budget: int) -> Any:
    def length(prompts: list[Conversational], completions: list[Conversational], completion_ids: list[list[int]],
               **_: object) -> list[float]:  # fmt: skip
        """0 up to `budget` completion tokens, then down to -1 at twice the budget (and below no further)."""
        return [-min(1.0, max(0, len(ids) - budget) / budget) for ids in completion_ids]

    return length


class Reward:
    """One reward function as TRL calls it, guarded (see the module docstring). `__name__` is what TRL logs."""

    def __init__(self, spec: RewardSpec, function: Callable[..., Any], columns: frozenset[str], timeout: float = 0
                 ) -> None:  # fmt: skip
        self.spec, self.function, self.__name__, self.timeout = spec, function, spec.name, timeout
        self.takes_any = any(p.kind is p.VAR_KEYWORD for p in _parameters(function))
        self.accepted = {p.name for p in _parameters(function)}
        self.columns = columns

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        wheres = kwargs.pop(WHERE, None) or ["?"] * len(prompts)
        given = {"prompts": prompts, "completions": completions, **kwargs}
        if not self.takes_any:
            given = {k: v for k, v in given.items() if k in self.accepted}
        try:
            with time_limit(self.timeout) as stopped:
                values = self.function(**given)
        except TimeUp:
            if stopped:
                log.error("%s did not return within %g s of %s (on the record at %s, first of this batch): "
                          "stopping without finishing the step; the last checkpoint is as it was", self._who(),
                          STOP_GRACE_S, signal.Signals(stopped[0]).name, wheres[0])  # fmt: skip
                raise Interrupted(stopped[0]) from None
            raise RewardFailed(f"{self._who()} did not return within TRAIN_RL_REWARD_TIMEOUT={self.timeout:g} s (on "
                               f"the record at {wheres[0]}, first of this batch); make it faster, or raise the "
                               f"limit; {self._fix()}") from None  # fmt: skip
        except Exception as exc:  # the user's code: any error ends the run, named
            raise RewardFailed(f"{self._who()} raised {type(exc).__name__}: {exc} (on the record at {wheres[0]}, "
                               f"first of this batch; {self._fix()})") from None  # fmt: skip
        return self._checked(values, wheres, completions)

    def _checked(self, values: Any, wheres: list[str], completions: list[Any]) -> list[float]:
        try:
            values = list(values)
        except TypeError:
            raise RewardFailed(f"{self._who()} returned {type(values).__name__}, not a list of numbers (one per "
                               f"completion); {self._fix()}") from None  # fmt: skip
        if len(values) != len(completions):
            raise RewardFailed(
                f"{self._who()} returned {len(values)} values for {len(completions)} completions (the "
                f"batch starting at the record at {wheres[0]}); return one number per completion"
            )
        out = []
        for i, value in enumerate(values):
            number = _number(value)
            if number is None:
                snippet = text_of(completions[i])[:80]
                raise RewardFailed(f"{self._who()} returned {value!r} for the completion {snippet!r} of the record at "
                                   f"{wheres[i]}; a reward is a finite number ({self._fix()})")  # fmt: skip
            out.append(number)
        return out

    def _who(self) -> str:
        where = f" in {self.spec.path}" if self.spec.kind == "function" else " (built-in)"
        return f"reward function {self.spec.function or self.spec.kind!r}{where}"

    def _fix(self) -> str:
        if self.spec.kind == "function":
            return (
                f"fix {self.spec.path}, then start again with TRAIN_RESUME_CHANGED_DATA=1 (the reward file changed): "
                "the run resumes from its last checkpoint"
            )
        return "check the records' columns it reads"


def _number(value: object) -> float | None:
    """A reward as a finite float: a number (not a bool, a string or another object float() would parse), else None."""
    if isinstance(value, bool) or (not isinstance(value, (int, float)) and not hasattr(value, "__float__")):
        return None
    return finite_float(value)


def _parameters(function: Callable[..., Any]) -> list[inspect.Parameter]:
    return list(inspect.signature(function).parameters.values())


def build_rewards(rewards: Rewards, columns: frozenset[str], max_new_tokens: int, timeout: float = 0) -> list[Any]:
    """TRAIN_REWARD as TRL's reward_funcs: Reward objects (each call limited to `timeout` seconds, 0: none), and a
    reward model folder's model; ConfigError (exit 2) naming a function that cannot be imported or called with TRL's
    arguments and the data's columns."""
    out: list[Any] = []
    for spec in rewards.specs:
        if spec.kind == "model":
            out.append(reward_model(spec.path))
            continue
        function = _function(spec, max_new_tokens)
        _check_signature(spec, function, columns)
        out.append(Reward(spec, function, columns, timeout))
    return out


def reward_model(folder: str) -> Any:
    """A reward model folder (what TRAIN_METHOD=reward writes) as TRL would load it from its path: a one-score
    classifier in Transformers' default dtype, here through trainer.model's one loader."""
    from trainer.model.loading import LoadHow, Weights, load

    return load(Weights(folder=folder), LoadHow(dtype=None, score_head=True))


def _function(spec: RewardSpec, max_new_tokens: int) -> Any:
    if spec.kind == "exact":
        return exact
    if spec.kind == "contains":
        return contains
    if spec.kind == "math":
        return math
    if spec.kind == "regex":
        return regex_reward(spec.argument)
    if spec.kind == "length":
        return length_reward(int(spec.argument) if spec.argument else max(1, max_new_tokens // 2))
    return _imported(spec)


def _imported(spec: RewardSpec) -> Any:
    module = import_file(spec.path, "TRAIN_REWARD")
    function = getattr(module, spec.function, None)
    if not callable(function):
        raise ConfigError(f"TRAIN_REWARD: {spec.text}: {spec.function} in {Path(spec.path).resolve()} is not a "
                          f"function ({type(function).__name__})")  # fmt: skip
    return function


def _check_signature(spec: RewardSpec, function: Callable[..., Any], columns: frozenset[str]) -> None:
    """Every parameter must be one TRL passes (prompts, completions, completion_ids, ...) or a column of the data;
    a function without **kwargs is given only the ones it names."""
    try:
        parameters = _parameters(function)
    except (TypeError, ValueError):
        return  # a builtin without a signature: the call itself will say
    known = set(TRL_ARGUMENTS) | set(columns)
    wrong = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL)
             or (p.kind is not p.VAR_KEYWORD and p.default is p.empty and p.name not in known)]  # fmt: skip
    names = {p.name for p in parameters}
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters)
    missing = [n for n in ("prompts", "completions") if n not in names and not takes_any]
    if wrong or missing:
        what = (
            f"parameters {', '.join(wrong)} are neither TRL's arguments nor data columns"
            if wrong
            else f"it takes no {' or '.join(missing)}"
        )
        signature = f"def {spec.function or spec.name}(prompts, completions, **columns) -> list[float]"
        raise ConfigError(
            f"TRAIN_REWARD: {spec.text}: {what}; a reward function is {signature} (the data's columns: "
            f"{', '.join(sorted(columns)) or 'none'})"
        )
