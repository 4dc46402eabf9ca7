"""Online RL (TRAIN_METHOD=grpo/rloo): TRAIN_REWARD's rewards, the TRAIN_RL_* options, the data layout the method
takes and the TRL config fields trainkit sets. Torch- and TRL-free: a user's reward file is read with `ast` here
(it exists, it parses, it defines the function); trainer/run/rewards.py imports it and checks its signature before
the model loads, and trainer/run/online.py builds TRL's trainer.
"""

from __future__ import annotations

import ast
import functools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.compat import switch_problem
from trainer.config import rl_tools
from trainer.config.decision import Decision
from trainer.config.rl_engine import VLLM_OPTIONS, engine_arguments, engine_problems
from trainer.config.schema import TrainSettings
from trainer.data.mix import split_weight
from trainer.methods import names, of, spoken
from trainer.provenance import file_sha256

BUILTINS = ("exact", "contains", "math", "regex", "length")
RL_OPTIONS = ("reward", "rl_generations", "rl_max_new_tokens", "rl_temperature", "rl_beta", "rl_loss", "rl_engine",
              "rl_reward_timeout", *VLLM_OPTIONS, *rl_tools.OPTIONS)  # fmt: skip
# TRAIN_RL_* option -> the methods it applies to (the others apply to every online method; TRL 1.16's tool loop is
# GRPOTrainer's only)
OPTION_METHODS = {name: names("online", option=name) for name in ("rl_loss", *rl_tools.OPTIONS)}
# What TRL passes every reward function (`environments` with TRAIN_RL_ENVIRONMENT); any other parameter is a column
TRL_ARGUMENTS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric",
                 "environments")  # fmt: skip
ANSWER_READERS = ("exact", "contains", "math")  # the built-ins that read each record's `answer`


@dataclass(frozen=True)
class RewardSpec:
    """One entry of TRAIN_REWARD: a built-in (`kind` its name, `argument` regex's pattern or length's budget), a
    user function (`kind` "function": `path`, `function`) or a reward model folder (`kind` "model": `path`)."""

    text: str  # the entry as written, less its weight
    kind: str
    name: str  # the name its reward is logged under (rewards/NAME/mean)
    weight: float = 1.0
    argument: str = ""
    path: str = ""
    function: str = ""


@dataclass(frozen=True)
class Rewards:
    """TRAIN_REWARD parsed: its entries in order and what is wrong with their syntax."""

    specs: tuple[RewardSpec, ...]
    problems: tuple[str, ...]

    def files(self) -> list[str]:
        """The user reward files that exist, each once, in order."""
        return list(dict.fromkeys(s.path for s in self.specs if s.kind == "function" and Path(s.path).is_file()))


@functools.lru_cache(maxsize=16)
def rewards(value: str) -> Rewards:
    """TRAIN_REWARD parsed once per value in a process: the checks, the decisions, the resume record and the run
    (trainer/run/rewards.py) all read this one parse."""
    specs, problems = _parse(value)
    return Rewards(tuple(specs), tuple(problems))


def _parse(value: str) -> tuple[list[RewardSpec], list[str]]:
    """(the rewards, problems) of TRAIN_REWARD: a comma list, each TERM or TERM:WEIGHT."""
    specs, problems = [], []
    for part in (p for p in value.split(",") if p.strip()):
        text, weight_text = split_weight(part)
        weight = float(weight_text) if weight_text is not None else 1.0
        if not math.isfinite(weight) or weight == 0:
            problems.append(f"TRAIN_REWARD: the weight {weight_text!r} of {text} is not a non-zero number")
        spec = _spec(text, weight)
        if isinstance(spec, str):
            problems.append(f"TRAIN_REWARD: {spec}")
        else:
            specs.append(spec)
    return _unique_names(specs), problems


def _spec(text: str, weight: float) -> RewardSpec | str:
    head, _, argument = text.partition("=")
    if head in BUILTINS:
        return _builtin(text, head, argument, weight)
    if ".py:" in text:
        path, _, function = text.rpartition(":")
        if not function.isidentifier():
            return f"{text}: {function!r} is no Python function name; write path/file.py:function"
        return RewardSpec(text, "function", function, weight, path=path, function=function)
    if text.endswith(".py"):
        return f"{text}: name the function too: {text}:FUNCTION"
    if Path(text).is_dir():
        return RewardSpec(text, "model", Path(text).name or "reward_model", weight, path=text)
    return (f"{text!r} is no reward: use a built-in ({', '.join(BUILTINS)}; regex=PATTERN, length=TOKENS), a user "
            "function path/file.py:function, or a reward model folder")  # fmt: skip


def _builtin(text: str, kind: str, argument: str, weight: float) -> RewardSpec | str:
    if kind == "regex":
        if not argument:
            return "regex needs its pattern: regex=PATTERN"
        try:
            re.compile(argument)
        except re.error as exc:
            return f"{text}: the pattern does not compile ({exc})"
    elif kind == "length":
        if argument and not (argument.isdigit() and int(argument) > 0):
            return f"{text}: length's budget is a whole number of tokens above 0 (length=200)"
    elif argument:
        return f"{text}: {kind} takes no argument"
    return RewardSpec(text, kind, kind, weight, argument=argument)


def _unique_names(specs: list[RewardSpec]) -> list[RewardSpec]:
    """Two entries with one name (two regexes) are logged as regex, regex_2."""
    seen: dict[str, int] = {}
    out = []
    for spec in specs:
        seen[spec.name] = seen.get(spec.name, 0) + 1
        name = spec.name if seen[spec.name] == 1 else f"{spec.name}_{seen[spec.name]}"
        out.append(RewardSpec(spec.text, spec.kind, name, spec.weight, spec.argument, spec.path, spec.function))
    return out


def reward_problems(value: str) -> list[str]:
    """TRAIN_REWARD read without running anything: each entry parses, each file exists and defines its function,
    each reward model folder holds a model."""
    if not value.strip():
        return ["TRAIN_REWARD is empty: name at least one reward, e.g. TRAIN_REWARD=exact or "
                "TRAIN_REWARD=/data/reward.py:score (docs/running.md, 'Online RL')"]  # fmt: skip
    problems = list(rewards(value).problems)
    for spec in rewards(value).specs:
        if spec.kind == "function":
            problems += _function_problems(spec)
        elif spec.kind == "model":
            problems += _reward_model_problems(Path(spec.path))
    return problems


def _reward_model_problems(folder: Path) -> list[str]:
    """A reward model folder must hold a sequence classifier with one score (config.json read, no weights)."""
    fix = "a reward model folder is what TRAIN_METHOD=reward writes (its final/)"
    try:
        config = json.loads((folder / "config.json").read_text())
    except FileNotFoundError:
        return [f"TRAIN_REWARD: {folder} holds no config.json; {fix}"]
    except (OSError, ValueError) as exc:
        return [f"TRAIN_REWARD: {folder}/config.json does not read as JSON ({exc}); {fix}"]
    architectures = config.get("architectures") if isinstance(config, dict) else None
    names = [a for a in architectures if isinstance(a, str)] if isinstance(architectures, list) else []
    labels = config.get("id2label") if isinstance(config, dict) else None
    scores = config.get("num_labels", len(labels) if isinstance(labels, dict) else 2) if isinstance(config, dict) else 0
    if not any(a.endswith("ForSequenceClassification") for a in names):
        what = ", ".join(names) or "no architecture"
        kind = " (a causal language model: it writes text, it gives no score)" if any(
            a.endswith("ForCausalLM") for a in names) else ""  # fmt: skip
        return [f"TRAIN_REWARD: {folder} holds {what}{kind}, not a sequence classifier with one score; {fix}"]
    if scores != 1:
        return [f"TRAIN_REWARD: {folder} holds a sequence classifier with {scores} labels, not one score; {fix}"]
    return []


def reward_stack_problems(s: TrainSettings) -> list[str]:
    """A built-in reward whose library this stack lacks (math: math-verify, where TRL is), named with the row; for
    any method, so a row's refusal reads the same whatever else is wrong."""
    found = (switch_problem(f"TRAIN_REWARD={spec.kind}") for spec in rewards(s.reward).specs)
    return [problem for problem in dict.fromkeys(found) if problem]


def _function_problems(spec: RewardSpec) -> list[str]:
    path = Path(spec.path)
    if not path.is_file():
        return [f"TRAIN_REWARD: {spec.text}: no such file {path}; mount it and give its path in the container"]
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError) as exc:
        return [f"TRAIN_REWARD: {spec.text}: {path} does not read as Python ({exc})"]
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        defined |= {t.id for t in targets if isinstance(t, ast.Name)}
    if spec.function not in defined:
        functions = sorted(n for n in defined if not n.startswith("_")) or ["none"]
        return [f"TRAIN_REWARD: {spec.text}: {path} defines no {spec.function!r} at its top level (it defines: "
                f"{', '.join(functions[:8])})"]  # fmt: skip
    return []


def reward_columns(spec: RewardSpec) -> list[str]:
    """The data columns a reward reads from every record: `answer` for exact/contains/math; a user function's
    parameters that are not TRL's arguments and have no default (read with ast: nothing runs)."""
    if spec.kind in ANSWER_READERS:
        return ["answer"]
    if spec.kind != "function":
        return []
    try:
        tree = ast.parse(Path(spec.path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError):
        return []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == spec.function:
            plain = [*node.args.posonlyargs, *node.args.args]
            required = plain[: len(plain) - len(node.args.defaults)]
            required += [a for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True) if d is None]
            return [a.arg for a in required if a.arg not in TRL_ARGUMENTS]
    return []


def missing_column_problems(value: str, rows: list[dict[str, Any]], wheres: list[str], variable: str) -> list[str]:
    """Each reward's columns against every prompt record: a record without one is named (file:line), with how many
    lack it and the columns the records have, before anything is trained."""
    have = sorted({k for row in rows for k in row if k != "prompt"})
    problems = []
    for spec in rewards(value).specs:
        for column in reward_columns(spec):
            lacking = [where for row, where in zip(rows, wheres, strict=True) if column not in row]
            if lacking:
                problems.append(
                    f"TRAIN_REWARD: {spec.text} reads each record's `{column}`, which {lacking[0]} lacks "
                    f"({len(lacking)} of {len(rows)} records of {variable} lack it; the records' columns: "
                    f"{', '.join(have) or 'none'}); give every record its `{column}`, or leave {spec.text} out of "
                    "TRAIN_REWARD"
                )
    return problems


def reward_identity(value: str) -> str:
    """TRAIN_REWARD as a checkpoint records it: each user file with its content's sha256, so that a changed reward
    file is a changed setting on resume (trainer.config.resume)."""
    files = rewards(value).files()
    if not files:
        return value
    return value + " (" + ", ".join(f"{f} sha256 {file_sha256(f)[:16]}" for f in files) + ")"


def reward_files(value: str) -> dict[str, str]:
    """{path: sha256} of every user reward file (provenance.json)."""
    return {path: file_sha256(path) for path in rewards(value).files()}


# ---- the options ----------------------------------------------------------------------------------------------


def option_problems(s: TrainSettings) -> list[str]:
    """TRAIN_REWARD and TRAIN_RL_* against the method; the batch against the group."""
    if of(s.method).family != "online":
        given = [f"TRAIN_{n.upper()}" for n in RL_OPTIONS if n in s.model_fields_set]
        return [f"{', '.join(given)}: for online RL (TRAIN_METHOD={spoken(names('online'))}), not "
                f"TRAIN_METHOD={s.method}; remove "
                f"{'them' if len(given) > 1 else 'it'}, or set TRAIN_METHOD=grpo"] if given else []  # fmt: skip
    problems = [f"TRAIN_{n.upper()} applies to TRAIN_METHOD={'/'.join(m)}, not TRAIN_METHOD={s.method}; remove it"
                for n, m in OPTION_METHODS.items() if n in s.model_fields_set and s.method not in m]  # fmt: skip
    problems += reward_problems(s.reward)
    problems += engine_problems(s)
    problems += [p for p in (switch_problem(f"TRAIN_{n.upper()}") for n in rl_tools.OPTIONS[:2]
                             if getattr(s, n)) if p]  # fmt: skip
    problems += rl_tools.tool_problems(s)
    completions = s.batch_size * s.grad_accum
    if completions % s.rl_generations:
        problems.append(f"TRAIN_BATCH_SIZE={s.batch_size} x TRAIN_GRAD_ACCUM={s.grad_accum} = {completions} "
                        f"completions per step is no multiple of TRAIN_RL_GENERATIONS={s.rl_generations} (each "
                        "prompt's group of completions is scored together); make TRAIN_BATCH_SIZE a multiple of it, "
                        f"e.g. {s.rl_generations * max(1, round(completions / s.rl_generations))}")  # fmt: skip
    if s.rl_beta > 0 and not s.lora and _is_preset(s.model):
        problems.append(f"TRAIN_RL_BETA={s.rl_beta} with a preset trained in full (TRAIN_LORA=0): TRL 1.16 loads the "
                        "KL reference from the model's files, which a preset has none of; use TRAIN_LORA=1 (the "
                        "reference is the adapter-disabled model) or a model folder")  # fmt: skip
    if s.eval_data or s.eval_split > 0:
        problems.append(
            f"TRAIN_EVAL_DATA/TRAIN_EVAL_SPLIT with TRAIN_METHOD={s.method}: evaluation during online RL "
            "is not supported yet; remove them (the rewards in metrics.jsonl are the measure)"
        )
    return problems


def _is_preset(model: str) -> bool:
    from trainer.config.presets import is_preset

    return is_preset(model)


def layout_problem(method: str, layouts: tuple[str, ...], variable: str, found: str) -> str | None:
    """Online RL takes prompts: `prompt` records, or `messages` ending on a user turn."""
    other = [x for x in layouts if x not in ("prompt", "messages")]
    if not other and layouts:
        return None
    return (
        f"TRAIN_METHOD={method} needs prompts (records with `prompt`, as text or messages, or `messages` ending "
        f"on a user turn; other fields reach the rewards); {variable} holds {found or 'no records'}"
    )


# ---- decisions and TRL's fields ----------------------------------------------------------------------------------


def decide_reference(s: TrainSettings) -> Decision[str]:
    if s.rl_beta == 0:
        return Decision("none", "TRAIN_RL_BETA=0: no KL term, so no reference model is held")
    if s.lora:
        return Decision("frozen adapter", f"TRAIN_RL_BETA={s.rl_beta} with TRAIN_LORA=1: the adapter-disabled model "
                        "is the KL reference (no second copy)")  # fmt: skip
    return Decision("frozen copy", f"TRAIN_RL_BETA={s.rl_beta}: TRL loads a second copy of the model from its folder")


def method_arguments(s: TrainSettings) -> dict[str, Any]:
    """GRPOConfig/RLOOConfig fields from TRAIN_RL_*; `max_length` is no field of theirs (prompts are not cut)."""
    args: dict[str, Any] = {
        "num_generations": s.rl_generations,
        "max_completion_length": s.rl_max_new_tokens,
        "temperature": s.rl_temperature,
        "beta": s.rl_beta,
        **engine_arguments(s),
        "reward_weights": [spec.weight for spec in rewards(s.reward).specs],
        "log_completions": False,  # trainkit logs the rewards; TRL's table needs rich/pandas output of its own
        # A DataLoader iterator draws its workers' base seed from torch's global generator, which also samples the
        # completions. Kept across epochs (persistent workers), a resumed run makes that draw at the next epoch
        # where the uninterrupted run made it at step 0, and samples differently from then on; made anew each epoch,
        # both runs draw at the same step. (For the other methods, TRAIN_NUM_WORKERS decides: trainer/config/optim.py.)
        "dataloader_persistent_workers": False,
    }
    if "rl_loss" in of(s.method).options:
        args["loss_type"] = "dapo" if s.rl_loss == "auto" else s.rl_loss
    return {**args, **rl_tools.arguments(s)}
