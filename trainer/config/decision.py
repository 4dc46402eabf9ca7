"""What a resolved run decided: `Decision` (one value and its reason), `Decisions` (every one of a run, typed) and
`SoFar` (the decisions made so far while the groups decide, and the problems met).

`Decisions` is what the run, the models and the benchmarks read (`cfg.decisions.attn.value`); its JSON form
(`to_dict`) is the "decisions" table of `python -m trainer config` and of run_config.json. Each decision is made by
the settings group that owns it (trainer/config/<group>.py's `decide`); trainer/config/decisions.py calls them in turn.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Generic, TypeVar

from trainer.errors import ConfigError

T = TypeVar("T")


@dataclass(frozen=True)
class Decision(Generic[T]):
    """One decided value and why."""

    value: T
    reason: str


@dataclass(frozen=True)
class Decisions:
    """Every decision of a resolved run, in the order `python -m trainer config` shows them."""

    data: Decision[str]
    packing: Decision[str]  # stream, records, or records+stream (plain text streamed, records whole)
    model: Decision[str]
    precision: Decision[str]  # fp32, bf16, fp16 or fp8 (bf16 autocast, float8 linears): config/precision.py
    tf32: Decision[bool]
    deepspeed: Decision[str | None]  # zeroN, a user config path, or None
    optim: Decision[str]  # a Transformers optimizer name, adamw_apex_fused, or "deepspeed"
    attn: Decision[str]  # the attn_implementation given to Transformers
    pin_memory: Decision[bool]
    auto_batch: Decision[bool]
    batch_size: Decision[int]  # per device; the TRAIN_AUTO_BATCH search replaces it when training starts
    grad_accum: Decision[int]  # the search may change it too, keeping the effective batch (run.batch_search)
    nproc_per_node: Decision[int]
    compile: Decision[bool]
    liger: Decision[bool]
    non_blocking: Decision[bool]  # asynchronous host-to-GPU copies of each batch
    nan_inf_filter: Decision[bool]  # Transformers' per-step NaN/Inf read of the loss
    quant: Decision[str]  # none, 4bit, 8bit
    lora: Decision[bool]
    fsdp: Decision[str]
    grad_ckpt: Decision[bool]
    profile: Decision[bool]
    memory_snapshot: Decision[bool]
    deterministic: Decision[bool]
    report_to: Decision[Any]
    resume: Decision[str]
    cuda_alloc_conf: Decision[str]
    args: Decision[dict[str, Any]] = field(default_factory=lambda: Decision({}, "TRAIN_ARGS empty"))
    data_format: Decision[str] = field(default_factory=lambda: Decision("", "not detected"))  # trainer.data.chat
    chat_template: Decision[str] = field(default_factory=lambda: Decision("none", "no conversations"))
    method: Decision[str] = field(default_factory=lambda: Decision("sft", "TRAIN_METHOD=sft"))  # config.method
    reference: Decision[str] = field(default_factory=lambda: Decision("none", "TRAIN_METHOD=sft"))
    # full or chunked (trainer.model.chunked_loss); a record written before it had the full loss
    cross_entropy: Decision[str] = field(default_factory=lambda: Decision("full", "Transformers' loss"))
    # a vision-language model's trained parts (TRAIN_TRAINABLE: trainer.model.vision_parts); a record written before
    # it trained no such model
    trainable: Decision[list[str]] = field(default_factory=lambda: Decision(["language"], "no vision-language model"))
    # the predicted peak GPU memory per process and its parts in bytes (trainer.memory); None: not predicted
    memory: Decision[Any] = field(default_factory=lambda: Decision(None, "not predicted"))
    # a mixture of experts' experts implementation and load-balancing coefficient (config/moe.py); None: dense
    moe_impl: Decision[str | None] = field(default_factory=lambda: Decision(None, "not a mixture of experts"))
    moe_aux_loss: Decision[float | None] = field(default_factory=lambda: Decision(None, "not a mixture of experts"))

    def to_dict(self) -> dict[str, dict[str, Any]]:
        chosen = {f.name: getattr(self, f.name) for f in fields(self)}
        return {name: {"value": d.value, "reason": d.reason} for name, d in chosen.items()}


@dataclass
class SoFar:
    """While the groups decide, in turn: the decisions made so far (a later group reads an earlier one's by name),
    the problems met (every one is reported, not only the first), and what the resolution was given: the process's
    environment and whether torch may be imported (False: unit tests of the logic on a described machine)."""

    environ: Mapping[str, str]
    import_heavy: bool = True
    decided: dict[str, Decision] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def __getitem__(self, name: str) -> Decision:
        return self.decided[name]

    def attempt(self, decide: Callable[..., Any], *args: Any, fallback: Any) -> Any:
        """`decide(*args)`; a ConfigError is recorded as problems and `fallback` stands in, so that the groups after
        it still decide and report theirs."""
        try:
            return decide(*args)
        except ConfigError as exc:
            self.problems.extend(exc.problems)
            return fallback
