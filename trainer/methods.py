"""TRAIN_METHOD: every training method, once: its name, its family (what the run builds: trainer.run.sft,
trainer.run.preference or trainer.run.online), the TRL trainer and config it runs on, the data it trains on, the
settings it takes of its own and those of SFT it refuses, and what its TRL config fixes.

Read by the checks and decisions (trainer/config/method.py, trainer/config/online.py), the run (trainer/run/train.py
dispatches on the family), `data --show`, the stack's refusals (trainer/compat.py) and bench; the schema's
TRAIN_METHOD values equal the names here (tests/trainer/test_methods.py). Stdlib only, like trainer/commands.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Family = Literal["sft", "preference", "online"]
FAMILIES: tuple[Family, ...] = ("sft", "preference", "online")

# SFT's data settings a method on TRL's trainers would silently ignore -> why it takes none
_PAIRS = (("packing", "pairs are never packed (each side is one padded sequence)"),
          ("loss_on", "a preference method trains each side's answer (the prompt never)"))  # fmt: skip
_PROMPTS = (_PAIRS[0], ("loss_on", "online RL trains on the generated completions"))


@dataclass(frozen=True)
class Trl:
    """A TRL trainer and its config: the module holding both, and the config's source relative to the trl package
    (its fields read without importing TRL)."""

    module: str
    trainer: str
    config: str
    config_file: str


@dataclass(frozen=True)
class Method:
    """One TRAIN_METHOD."""

    name: str
    family: Family
    data: str  # what it trains on: "text" (text, prompt/completion, conversations), "pairs" or "prompts"
    trl: Trl | None = None  # the TRL trainer it runs on (None: Transformers' Trainer)
    beta: float | None = None  # TRL's default TRAIN_PREF_BETA (None: the method has none)
    reference: bool = False  # a reference model (TRAIN_PREF_REFERENCE)
    unpaired: bool = False  # trains on prompt/completion/label examples (KTO's); pairs are split in two
    classifier: bool = False  # trains a one-score classifier (a reward model): in full, on whole pairs
    options: tuple[str, ...] = ()  # settings of its own beyond its family's (TRAIN_PREF_LOSS, TRAIN_RL_LOSS)
    fixed: tuple[tuple[str, object], ...] = ()  # TRL config fields the method is (SimPO: CPO's simpo loss)
    refuses: tuple[tuple[str, str], ...] = ()  # SFT's settings it takes none of -> why

    @property
    def needs_trl(self) -> bool:
        return self.trl is not None


METHODS: tuple[Method, ...] = (
    Method("sft", "sft", "text"),
    Method("dpo", "preference", "pairs", Trl("trl", "DPOTrainer", "DPOConfig", "trainer/dpo_config.py"), beta=0.1,
           reference=True, options=("pref_loss",), refuses=_PAIRS),
    Method("orpo", "preference", "pairs", Trl("trl.experimental.orpo", "ORPOTrainer", "ORPOConfig",
                                              "experimental/orpo/orpo_config.py"), beta=0.1, refuses=_PAIRS),
    Method("kto", "preference", "pairs", Trl("trl", "KTOTrainer", "KTOConfig", "trainer/kto_config.py"), beta=0.1,
           reference=True, unpaired=True, refuses=_PAIRS),
    Method("simpo", "preference", "pairs", Trl("trl.experimental.cpo", "CPOTrainer", "CPOConfig",
                                               "experimental/cpo/cpo_config.py"), beta=2.0,
           fixed=(("loss_type", "simpo"), ("cpo_alpha", 0.0)), refuses=_PAIRS),
    Method("reward", "preference", "pairs", Trl("trl", "RewardTrainer", "RewardConfig", "trainer/reward_config.py"),
           classifier=True, refuses=_PAIRS),
    Method("grpo", "online", "prompts", Trl("trl", "GRPOTrainer", "GRPOConfig", "trainer/grpo_config.py"),
           options=("rl_loss", "rl_tools", "rl_environment", "rl_max_turns", "rl_tool_timeout"), refuses=_PROMPTS),
    Method("rloo", "online", "prompts", Trl("trl", "RLOOTrainer", "RLOOConfig", "trainer/rloo_config.py"),
           refuses=_PROMPTS),
)  # fmt: skip
BY_NAME = {m.name: m for m in METHODS}


def of(name: str) -> Method:
    """The method named `name` (a TRAIN_METHOD value: the schema admits no other)."""
    return BY_NAME[name]


def names(family: Family | None = None, *, option: str | None = None, trl: bool | None = None) -> tuple[str, ...]:
    """The methods' names in the table's order; `family`, `option` (a setting of its own) and `trl` keep those
    that match."""
    return tuple(m.name for m in METHODS if (family is None or m.family == family)
                 and (option is None or option in m.options) and (trl is None or m.needs_trl == trl))  # fmt: skip


def spoken(found: tuple[str, ...], last: str = "or") -> str:
    """Names as a message says them: 'grpo or rloo', 'dpo, kto or orpo'."""
    return found[0] if len(found) == 1 else f"{', '.join(found[:-1])} {last} {found[-1]}"
