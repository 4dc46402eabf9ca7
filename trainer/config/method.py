"""The method group's home (TRAIN_METHOD, TRAIN_PREF_*, TRAIN_REWARD, TRAIN_RL_*; the methods themselves are rows of
trainer/methods.py): which options apply to a method, its data, its reference model, and the TRL config fields it
sets and takes (TRAIN_ARGS). Online RL's own rules (TRAIN_REWARD's parse, TRAIN_RL_*) are its part
trainer/config/online.py, and the vLLM engine's (TRAIN_RL_ENGINE, TRAIN_RL_VLLM_*) trainer/config/rl_engine.py.
Torch- and TRL-free (TRL's config fields are read from its source with `ast`, as trainer.transformers_names reads
TrainingArguments'); trainer/run/preference.py and trainer/run/online.py build the trainers.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer import compat
from trainer.config import online, rl_engine, rl_tools
from trainer.config.decision import Decision, Decisions, SoFar
from trainer.config.schema import TrainSettings
from trainer.config.sharding import deepspeed_stage
from trainer.data.chat import LAYOUT_NAMES, no_template_problem
from trainer.data.preference import PREFERENCE_LAYOUTS, PreferenceRecords
from trainer.errors import ConfigError
from trainer.methods import METHODS, names, of

if TYPE_CHECKING:
    from trainer.config.inputs import Inputs
    from trainer.machine.hardware import Hardware


# TRAIN_PREF_* option -> the methods it applies to
OPTION_METHODS = {
    "pref_beta": tuple(m.name for m in METHODS if m.family == "preference" and m.beta is not None),
    "pref_loss": names("preference", option="pref_loss"),
    "pref_reference": tuple(m.name for m in METHODS if m.reference),
    "pref_max_prompt_len": names("preference"),
}


def is_preference(settings: TrainSettings) -> bool:
    return of(settings.method).family == "preference"


def on_trl(settings: TrainSettings) -> bool:
    """Whether the method runs on a TRL trainer (preference tuning or online RL), not SFT's Trainer."""
    return of(settings.method).needs_trl


# ---- checks (stage 1) -----------------------------------------------------------------------------------------


def option_problems(s: TrainSettings) -> list[str]:
    """A TRAIN_PREF_* option given for a method it does not apply to is an error, never silently ignored."""
    problems = online.option_problems(s) + online.reward_stack_problems(s)
    for name, methods in OPTION_METHODS.items():
        if name in s.model_fields_set and s.method not in methods:
            problems.append(f"TRAIN_{name.upper()} applies to TRAIN_METHOD={'/'.join(methods)}, not "
                            f"TRAIN_METHOD={s.method}; remove it, or choose one of those methods")  # fmt: skip
    if is_preference(s) and s.pref_max_prompt_len >= s.seq_len:
        problems.append(f"TRAIN_PREF_MAX_PROMPT_LEN={s.pref_max_prompt_len} leaves no room for the answer within "
                        f"TRAIN_SEQ_LEN={s.seq_len}; set it below TRAIN_SEQ_LEN (or 0: no limit of its own)")
    if on_trl(s):
        problems += _trl_problems(s)
    if is_preference(s):
        problems += reference_problems(s)
        if of(s.method).classifier:  # trainer.run.preference builds it itself: a full one-score classifier
            given = [x for x, on in (("TRAIN_LORA=1", s.lora), (f"TRAIN_QUANT={s.quant}", s.quant != "none")) if on]
            problems += [f"{x} with TRAIN_METHOD=reward: trainkit trains a reward model (a one-score classifier) in "
                         "full; its adapters and quantization are for causal language models so far; remove it"
                         for x in given]  # fmt: skip
    return problems


def _trl_problems(s: TrainSettings) -> list[str]:
    """The settings a method's row refuses (trainer/methods.py: what trainkit applies to SFT's trainer only)."""
    return [f"TRAIN_{name.upper()} is for TRAIN_METHOD=sft: {why}; remove it"
            for name, why in of(s.method).refuses if name in s.model_fields_set]  # fmt: skip


def reference_problems(s: TrainSettings) -> list[str]:
    """The reference model against LoRA and sharding: what TRL 1.16 cannot do (FSDP and DeepSpeed otherwise run
    as for SFT, TRL preparing the reference for them: ZeRO-3 shards it, FSDP wraps it)."""
    if not of(s.method).reference:
        return []
    problems = []
    reference = decide_reference(s).value
    if s.lora and s.pref_reference == "copy":
        problems.append("TRAIN_PREF_REFERENCE=copy with TRAIN_LORA=1: TRL 1.16 takes no adapter model as a separate "
                        "reference; with LoRA the reference is the starting adapter (equal to the base, no second "
                        "copy): use TRAIN_PREF_REFERENCE=auto (or precompute)")  # fmt: skip
    elif reference == "frozen copy" and deepspeed_stage(s) == 3:
        problems.append(f"TRAIN_METHOD={s.method} without LoRA under DeepSpeed ZeRO-3: the frozen reference copy "
                        "would copy ZeRO-3's partitions, not the model; use TRAIN_LORA=1 (the reference is the same "
                        "sharded model, adapter disabled) or TRAIN_PREF_REFERENCE=precompute")  # fmt: skip
    if reference == "precomputed" and s.fsdp != "none" and not s.lora:
        problems.append(f"TRAIN_PREF_REFERENCE=precompute with TRAIN_FSDP={s.fsdp}: under FSDP TRL 1.16 loads a "
                        "second, unsharded model from TRAIN_MODEL's files to precompute with (a preset has none), the "
                        "memory precompute is meant to save; use TRAIN_PREF_REFERENCE=auto (FSDP shards the "
                        "reference) or TRAIN_LORA=1 (the adapter-disabled model is the reference)")  # fmt: skip
    return problems


def layout_problem(method: str, layouts: tuple[str, ...], variable: str) -> str | None:
    """The data's layout against the method's: SFT given pairs, or a preference method given SFT data."""
    found = ", ".join(LAYOUT_NAMES.get(x, x) for x in layouts)
    preference = [x for x in layouts if x in PREFERENCE_LAYOUTS]
    facts = of(method)
    if facts.family == "online":
        return online.layout_problem(method, layouts, variable, found)
    if facts.family == "sft":
        if "prompt" in layouts:
            return (f"{variable} holds prompts without answers ({found}); TRAIN_METHOD=sft trains on answers: give "
                    "prompt/completion records, or set TRAIN_METHOD=grpo to train on generated answers")
        if not preference:
            return None
        first, *others = names("preference")
        return (f"{variable} holds preference data ({found}) but TRAIN_METHOD=sft trains on text, prompt/completion "
                f"or conversations; set TRAIN_METHOD={first} (or {', '.join(others)}) to train on it")  # fmt: skip
    needed = "preference pairs (prompt/chosen/rejected, as text or message lists)"
    if facts.unpaired:
        needed += " or prompt/completion/label records"
    other = [x for x in layouts if x not in PREFERENCE_LAYOUTS]
    if other or not layouts:
        return f"TRAIN_METHOD={method} needs {needed}; {variable} holds {found or 'no records'}"
    if "unpaired" in layouts and not facts.unpaired:
        return (f"TRAIN_METHOD={method} needs {needed}; {variable} holds prompt/completion/label records (unpaired, "
                "KTO's): use TRAIN_METHOD=kto, or pairs")  # fmt: skip
    return None


def data_problems(inputs: Inputs, hub: bool = False) -> list[str]:
    """The layouts of TRAIN_DATA and TRAIN_EVAL_DATA against the method, then (preference methods) every record:
    local data in the static checks, Hub datasets (`hub`) once fetched, after every other check passed."""
    s = inputs.settings
    problems = []
    keys = ["data"] + (["eval_data"] if s.eval_data else [])
    for key in (k for k in keys if inputs.on_hub(k) == hub):
        source = getattr(inputs, key)
        if source.problems or (source.embedded and of(s.method).data == "text"):
            continue
        if source.embedded:
            what = "prompts" if of(s.method).data == "prompts" else "preference data"
            problems.append(f"TRAIN_METHOD={s.method} needs {what}: {source.variable} is empty or missing (the "
                            f"embedded corpus is plain text); point it at a {what.split()[0]} file")  # fmt: skip
            continue
        found = layout_problem(s.method, source.layouts, source.variable)
        if found:
            problems.append(found)
        elif of(s.method).family == "online":
            records = inputs.prompts if key == "data" else inputs.eval_prompts
            problems += records.problems or online.missing_column_problems(s.reward, records.rows, records.wheres,
                                                                           source.variable)
            if key == "data" and not records.problems:
                problems += rl_tools.record_problems(s, records.rows, records.wheres, records.chat)
        elif is_preference(s):
            problems += records_of(inputs, key).problems
    return problems


def records_of(inputs: Inputs, key: str = "data") -> PreferenceRecords:
    """Every record of TRAIN_DATA (`key` "data") or TRAIN_EVAL_DATA ("eval_data"), read and checked once per run
    (kept on `inputs`: the checks, `data --show` and the run share the one read)."""
    return inputs.pairs if key == "data" else inputs.eval_pairs


def template_problem(inputs: Inputs) -> str | None:
    """Conversational pairs need a chat template (the same one SFT renders with)."""
    source = inputs.data
    if not on_trl(inputs.settings) or source.problems or not any(x != "preference" for x in source.layouts):
        return None
    try:
        choice = inputs.template()
    except ConfigError as exc:
        return exc.message
    rows = inputs.prompts.rows if of(inputs.settings.method).data == "prompts" else records_of(inputs).rows
    chat = any(isinstance(row.get("prompt"), list) for row in rows[:1])
    return no_template_problem(source.layout_names(), choice.origin) if chat and choice.text is None else None


# ---- decisions ------------------------------------------------------------------------------------------------


def decide_reference(s: TrainSettings) -> Decision[str]:
    """The reference model done the way that costs least (recorded in run_config.json)."""
    facts = of(s.method)
    if facts.family != "preference":
        return Decision("none", f"TRAIN_METHOD={s.method}") if facts.family == "sft" else online.decide_reference(s)
    if facts.classifier:
        return Decision("none", "a reward model scores each side of a pair: no reference model")
    if not facts.reference:
        return Decision("none", f"{s.method} compares the policy's own log-probs: no reference model")
    if s.pref_reference == "precompute":
        return Decision("precomputed", "TRAIN_PREF_REFERENCE=precompute: the reference log-probs of every pair are "
                        "computed once before training; no reference is held while training")  # fmt: skip
    if s.lora and s.pref_reference == "auto":
        return Decision("frozen adapter", "TRAIN_LORA=1: the shared base with a frozen copy of the starting adapter "
                        "(TRL's 'ref' adapter, equal to the base at the start) is the reference: adapter-sized, no "
                        f"second copy of the model{_sharded(s)}")  # fmt: skip
    why = "TRAIN_PREF_REFERENCE=copy" if s.pref_reference == "copy" else "full fine-tuning (TRAIN_LORA=0)"
    return Decision("frozen copy", f"{why}: a frozen copy of the starting model (TRAIN_PREF_REFERENCE=precompute "
                    f"saves its memory){_sharded(s)}")  # fmt: skip


def _sharded(s: TrainSettings) -> str:
    if s.fsdp != "none":
        return f"; TRL wraps it with FSDP ({s.fsdp}) like the policy"
    stage = deepspeed_stage(s)
    if not stage:
        return ""
    return f"; TRL prepares it for DeepSpeed ZeRO-{stage}" + (", sharded with the model" if stage == 3 else "")


def decide_method(s: TrainSettings) -> Decision[str]:
    facts = of(s.method).trl
    if facts is None:
        return Decision("sft", "TRAIN_METHOD=sft (default): supervised training on the data's own tokens")
    prompts = ""
    if is_preference(s) and s.pref_max_prompt_len:
        cut = "cut from the left" if s.long_records == "truncate" else "dropped (TRAIN_LONG_RECORDS=drop)"
        prompts = f"; prompts over TRAIN_PREF_MAX_PROMPT_LEN={s.pref_max_prompt_len} tokens {cut} by trainkit"
    return Decision(s.method, f"TRL's {facts.trainer} ({facts.module}), {config_fields_text(s)}{prompts}")


def config_fields_text(s: TrainSettings) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in method_arguments(s).items())


def method_arguments(s: TrainSettings) -> dict[str, Any]:
    """The TRL config fields trainkit sets for the method (TRAIN_ARGS may set others, and wins)."""
    facts = of(s.method)
    if facts.family == "online":
        return online.method_arguments(s)
    if facts.family != "preference":
        return {}
    args: dict[str, Any] = dict(facts.fixed)
    if facts.beta is not None:
        args["beta"] = s.pref_beta or facts.beta
    if "pref_loss" in facts.options:
        args["loss_type"] = ["sigmoid" if s.pref_loss == "auto" else s.pref_loss]
    if facts.reference:
        args["precompute_ref_log_probs"] = s.pref_reference == "precompute"
    # truncate: TRL keeps the prompt both sides share and cuts each answer where the limit falls (RewardTrainer drops
    # instead: the run drops those pairs itself and says so); drop: the run drops long pairs before TRL sees them
    args["max_length"] = s.seq_len
    return args


# ---- TRAIN_ARGS: the TRL config's fields ------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def config_fields(method: str) -> frozenset[str]:
    """Field names the method's TRL config adds to TrainingArguments, read from TRL's source; empty without TRL."""
    trl = of(method).trl
    if trl is None:
        return frozenset()
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    path = Path(next(iter(spec.submodule_search_locations))) / trl.config_file
    if not path.is_file():
        return frozenset()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef) and node.name == trl.config:
            return frozenset(
                item.target.id for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                and not item.target.id.startswith("_")
            )  # fmt: skip
    return frozenset()


def config_name(s: TrainSettings) -> str:
    """The name of the method's TRL config class (a method on TRL's trainers)."""
    trl = of(s.method).trl
    assert trl is not None, s.method
    return trl.config


def config_class(method: str) -> Any:
    """The TRL config class of a method on TRL's trainers (imports TRL)."""
    import importlib

    trl = of(method).trl
    assert trl is not None, method
    return getattr(importlib.import_module(trl.module), trl.config)


def trl_fields(s: TrainSettings) -> frozenset[str]:
    """The fields the run's TRL config adds to TrainingArguments (empty for SFT's Trainer)."""
    return config_fields(s.method) if on_trl(s) else frozenset()


def arguments_class(s: TrainSettings) -> Any:
    """The class the run's arguments are made with: its method's TRL config, or None for TrainingArguments (SFT)."""
    return config_class(s.method) if on_trl(s) else None


def trainer_class(method: str) -> Any:
    import importlib

    trl = of(method).trl
    assert trl is not None, method
    return getattr(importlib.import_module(trl.module), trl.trainer)


# ---- the group's functions (trainer/config/checks.py, decisions.py, training_arguments.py call them) ----------------


def problems(inputs: Inputs) -> list[str]:
    s = inputs.settings
    refusals = [compat.switch_problem(f"TRAIN_METHOD={s.method}")]
    return [*(r for r in refusals if r), *option_problems(s), *data_problems(inputs)]


def problems_after_hub(inputs: Inputs) -> list[str]:
    """A Hub dataset's records against the method, once fetched; conversational pairs or prompts without a chat
    template (it may come with a Hub tokenizer)."""
    return data_problems(inputs, hub=True) or [p for p in [template_problem(inputs)] if p]


def decide(inputs: Inputs, hardware: Hardware, so_far: SoFar) -> dict[str, Decision]:
    s = inputs.settings
    so_far.problems.extend(rl_engine.hardware_problems(s, hardware.is_gpu))
    return {"method": decide_method(s), "reference": decide_reference(s)}


def arguments(settings: TrainSettings, decisions: Decisions, hardware: Hardware) -> dict[str, Any]:
    return method_arguments(settings)
