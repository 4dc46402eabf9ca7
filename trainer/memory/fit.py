"""Will it fit on this GPU (or a described one)? The prediction of trainer/memory/predict.py for a resolved run, the
verdict against the device, the cheapest changes that would fit (each predicted again), and the refusal of a GPU run
predicted not to fit beyond the prediction's error (exit 2, before the model loads; TRAIN_MEMORY_CHECK=off runs it
anyway)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.config.decision import Decision
from trainer.config.presets import is_preset
from trainer.config.speed import CHUNK_POSITIONS
from trainer.errors import ConfigError
from trainer.memory.predict import SOURCES, Plan, Prediction
from trainer.memory.shape import EXPERTS, LINEARS, Shape, folder_shape, preset_shape
from trainer.memory.vision import predict_model, vision_of
from trainer.methods import of

if TYPE_CHECKING:
    from trainer.config.run_config import RunConfig
    from trainer.config.schema import TrainSettings

GIB = 1 << 30
# The prediction's error on a GPU: not measured yet (no GPU run has compared them); the goal's 10% until one has.
ERROR = 0.10


def tokenizer_vocab(folder: str) -> int | None:
    """Rows a tokenizer folder's tokenizer.json needs (its vocabulary and added tokens); None where it has none."""
    try:
        data = json.loads((Path(folder) / "tokenizer.json").read_text())
    except (OSError, ValueError):
        return None
    ids = [*data.get("model", {}).get("vocab", {}).values(), *(t["id"] for t in data.get("added_tokens", []))]
    return max(ids) + 1 if ids else None


def shape_of(cfg: RunConfig) -> Shape:
    s = cfg.settings
    if is_preset(s.model):
        vocab = tokenizer_vocab(cfg.inputs.tokenizer_folder) if s.tokenizer else None
        return preset_shape(s.model, vocab or 259) if vocab else preset_shape(s.model)
    return folder_shape(cfg.decisions.model.value)


def plan_of(cfg: RunConfig, batch: int | None = None) -> Plan:
    """The memory-relevant decisions of `cfg` (at micro-batch `batch`, else the decided one)."""
    s, d = cfg.settings, cfg.decisions
    targets = lora_targets(s.lora_targets)
    online = of(s.method).family == "online"
    return Plan(
        shape=shape_of(cfg), batch=batch or d.batch_size.value, seq_len=s.seq_len, precision=d.precision.value,
        grad_accum=d.grad_accum.value, lora=s.lora, lora_r=s.lora_r, lora_targets=targets,
        lora_dropout=s.lora_dropout, quant=s.quant,
        optim=d.optim.value, zero_stage=s.zero_stage, zero_offload=s.zero_offload if s.zero_stage else "none",
        fsdp=s.fsdp, processes=d.nproc_per_node.value, grad_ckpt=d.grad_ckpt.value, attn=d.attn.value,
        record_mask="records" in d.packing.value and not d.attn.value.startswith("flash"),
        method=s.method, reference=d.reference.value, rl_new_tokens=s.rl_max_new_tokens if online else 0,
        rl_engine=s.rl_engine if online else "transformers", vllm_bytes=vllm_share(cfg),
        loss_chunk_tokens=CHUNK_POSITIONS if d.cross_entropy.value == "chunked" else 0,
        moe_impl=d.moe_impl.value or "grouped_mm", vision=vision_of(cfg), trainable=tuple(d.trainable.value),
    )  # fmt: skip


def lora_targets(setting: str) -> tuple[str, ...]:
    """TRAIN_LORA_TARGETS as the prediction's names (trainer.model.lora_targets' words): all-linear is every linear
    and the routed experts, attention its four projections."""
    found: list[str] = []
    for word in (w.strip() for w in setting.split(",") if w.strip()):
        found += {"all-linear": [*LINEARS, EXPERTS], "attention": list(LINEARS[:4])}.get(word, [word])
    return tuple(dict.fromkeys(found))


def vllm_colocated(s: TrainSettings) -> bool:
    """Online RL generating with vLLM in the training process (TRAIN_RL_ENGINE=vllm without TRAIN_RL_VLLM_URL)."""
    return of(s.method).family == "online" and s.rl_engine == "vllm" and not s.rl_vllm_url


def vllm_share(cfg: RunConfig) -> int:
    """What vLLM colocated takes of the device inside the training process: TRAIN_RL_VLLM_MEMORY of its memory; 0
    otherwise, and where there is no device to take it of."""
    s, device = cfg.settings, cfg.hardware.total_memory_bytes if cfg.hardware.is_gpu else None
    return int(s.rl_vllm_memory * device) if vllm_colocated(s) and device else 0


@dataclass(frozen=True)
class Change:
    """One way to need less memory: its settings, how much it costs (rank: cheapest first) and what it changes."""

    settings: str
    cost: int
    applies: Callable[[Plan], bool]
    apply: Callable[[Plan], Plan]
    note: str = ""


ADAM = ("adamw_torch", "adamw_torch_fused", "adamw_apex_fused", "adamw_hf")
CHANGES = (
    Change("TRAIN_GRAD_CKPT=1", 2, lambda p: not p.grad_ckpt, lambda p: replace(p, grad_ckpt=True),
           "about a third more compute"),
    Change("TRAIN_OPTIM=adamw_bnb_8bit", 3, lambda p: p.optim in ADAM and not p.zero_stage,
           lambda p: replace(p, optim="adamw_bnb_8bit"), "8-bit optimizer state"),
    Change("TRAIN_ZERO_STAGE=2", 4, lambda p: p.processes > 1 and not p.zero_stage and p.fsdp == "none",
           lambda p: replace(p, zero_stage=2), "gradients and optimizer state sharded across the processes"),
    Change("TRAIN_ZERO_STAGE=3", 4, lambda p: p.processes > 1 and p.zero_stage < 3 and p.fsdp == "none",
           lambda p: replace(p, zero_stage=3), "weights too sharded across the processes"),
    Change("TRAIN_ZERO_STAGE=2 TRAIN_ZERO_OFFLOAD=cpu", 5,
           lambda p: p.zero_offload == "none" and p.fsdp == "none" and not p.lora,
           lambda p: replace(p, zero_stage=max(p.zero_stage, 2), zero_offload="cpu", optim="deepspeed"),
           "optimizer state in CPU memory (slower steps)"),
    Change("TRAIN_LORA=1", 6, lambda p: not p.lora and p.zero_stage == 0, lambda p: replace(p, lora=True),
           "trains LoRA adapters instead of all weights"),
    Change("TRAIN_LORA=1 TRAIN_QUANT=4bit", 7, lambda p: p.quant == "none" and p.zero_stage == 0 and p.fsdp == "none",
           lambda p: replace(p, lora=True, quant="4bit"), "QLoRA: a 4-bit base, LoRA adapters trained"),
)  # fmt: skip


@dataclass(frozen=True)
class Suggestion:
    settings: str
    note: str
    prediction: Prediction


def smaller_batch(plan: Plan, device: int) -> Plan | None:
    """The largest micro-batch under `plan.batch` that divides the effective batch (accumulation keeps it) and fits."""
    effective = plan.batch * plan.grad_accum
    for micro in range(plan.batch - 1, 0, -1):
        if effective % micro == 0:
            smaller = replace(plan, batch=micro, grad_accum=effective // micro)
            if predict_model(smaller).peak <= device:
                return smaller
    return None


def cheaper(plan: Plan, device: int, most: int = 5) -> list[Suggestion]:
    """The cheapest changes (up to three together, with a smaller micro-batch where that is what fits) under which
    the run is predicted to fit in `device` bytes; none that contains a cheaper one that fits already, and none
    that needs a smaller micro-batch where a smaller micro-batch alone fits."""
    found: list[tuple[int, Suggestion]] = []
    kept: list[frozenset[str]] = []
    options = [change for change in CHANGES if change.applies(plan)]
    batch_only = smaller_batch(plan, device)
    if batch_only is not None:
        found.append((1, Suggestion(batch_settings(batch_only), "the same effective batch by accumulation",
                                    predict_model(batch_only))))  # fmt: skip
    for size in (1, 2, 3):
        for combo in itertools.combinations(options, size):
            names = frozenset(c.settings for c in combo)
            if any(earlier <= names for earlier in kept) or not all(c.applies(plan) for c in combo):
                continue
            changed = plan
            for change in combo:
                changed = change.apply(changed)
            settings, cost = " ".join(c.settings for c in combo), sum(c.cost for c in combo)
            if predict_model(changed).peak > device:
                split = smaller_batch(changed, device) if batch_only is None else None  # else: the split alone fits
                if split is None:
                    continue
                changed, settings, cost = split, f"{settings} {batch_settings(split)}", cost + 1
            else:
                kept.append(names)
            note = "; ".join(c.note for c in combo if c.note)
            found.append((cost, Suggestion(settings, note, predict_model(changed))))
    found.sort(key=lambda item: (item[0], item[1].prediction.peak))
    return [suggestion for _, suggestion in found[:most]]


def batch_settings(plan: Plan) -> str:
    return f"TRAIN_BATCH_SIZE={plan.batch} TRAIN_GRAD_ACCUM={plan.grad_accum}"


def gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def describe(prediction: Prediction, device: int | None, where: str) -> list[str]:
    """The report's lines: the plan, each part with where it comes from, the peak against the device."""
    p = prediction.plan
    lines = [f"Predicted peak GPU memory per process: {gib(prediction.peak)}"
             + (f" of {gib(device)} ({where})" if device else ""),
             f"  for {p.batch} x {p.seq_len} tokens per micro-batch, precision {p.precision}, optimizer {p.optim}"
             f"{', LoRA' if p.lora else ''}{f', quant {p.quant}' if p.quant != 'none' else ''}"
             f"{', gradient checkpointing' if p.grad_ckpt else ''}"
             f"{f', ZeRO-{p.zero_stage}' if p.zero_stage else ''}{f', FSDP {p.fsdp}' if p.fsdp != 'none' else ''}"
             f" over {p.processes} process(es); {p.shape.total():,} parameters, "
             f"vocabulary {p.shape.vocab:,}"]  # fmt: skip
    for name, value in prediction.parts.items():
        lines.append(f"  {name:<16} {gib(value):>11}  {SOURCES[name]}")
    return lines


def verdict(prediction: Prediction, device: int) -> dict[str, Any]:
    return {"predicted_peak_bytes": prediction.peak, "predicted_allocated_bytes": prediction.allocated,
            "parts": dict(prediction.parts), "sources": dict(SOURCES), "device_bytes": device,
            "fits": prediction.peak <= device, "headroom_bytes": device - prediction.peak,
            "error": f"unmeasured on GPUs (the refusal allows {ERROR:.0%})"}  # fmt: skip


def refusal(cfg: RunConfig) -> str | None:
    """The message refusing a GPU run predicted over its device by more than the prediction's error; None where it
    fits, where TRAIN_MEMORY_CHECK=off, on a CPU, or where no prediction can be made (a model that is not a decoder
    of the Llama family's fields: the run goes on, and the log says so)."""
    hw, s = cfg.hardware, cfg.settings
    if not hw.is_gpu or not hw.total_memory_bytes or s.memory_check == "off":
        return None
    try:  # with the batch search on, the search can go down to 1 (keeping the effective batch by accumulation)
        plan = plan_of(cfg, batch=1 if cfg.decisions.auto_batch.value else None)
    except (OSError, KeyError, ValueError):
        return None
    prediction, device = predict_model(plan), hw.total_memory_bytes
    if prediction.peak <= device * (1 + ERROR):
        return None
    lines = describe(prediction, device, f"{hw.gpu_name}")
    if cfg.decisions.auto_batch.value:
        lines.append("  (TRAIN_AUTO_BATCH is on: predicted at batch 1, the smallest its search can reach)")
    options = cheaper(plan, device)
    advice = ["Changes predicted to fit:", *(f"  {o.settings}: {gib(o.prediction.peak)} ({o.note})" for o in options)]
    return "\n".join([
        f"the run is predicted not to fit in GPU memory: {gib(prediction.peak)} per process, more than the "
        f"{gib(device)} of the {hw.gpu_name} by over the prediction's allowed error ({ERROR:.0%}, unmeasured on GPUs)",
        *lines, *(advice if options else ["No change of those tried fits: a GPU with more memory, or more GPUs."]),
        "To run anyway: TRAIN_MEMORY_CHECK=off.",
    ])  # fmt: skip


def check(cfg: RunConfig) -> None:
    """ConfigError (exit 2) for a GPU run predicted not to fit (`refusal`): the run asks it before it loads the model,
    `doctor` to report it."""
    message = refusal(cfg)
    if message:
        raise ConfigError(message)


def predicted(cfg: RunConfig, refuse: bool = True) -> RunConfig:
    """`cfg` with its prediction in decisions.memory (what `config` shows and run_config.json records); with `refuse`,
    a GPU run predicted not to fit exits 2 here (`check`), before any model is loaded."""
    if refuse:
        check(cfg)
    return replace(cfg, decisions=replace(cfg.decisions, memory=memory_decision(cfg)))


def memory_decision(cfg: RunConfig) -> Decision[Any]:
    """The run's record of its prediction (decisions.memory, run_config.json): the peak and the allocator's share of
    it (what peak_mem_bytes measures), the parts, at the decided batch; on a GPU beside its memory."""
    try:
        prediction = predict_model(plan_of(cfg))
    except (OSError, KeyError, ValueError) as exc:
        return Decision(None, f"not predicted: the model's shape could not be read ({exc})")
    device = cfg.hardware.total_memory_bytes if cfg.hardware.is_gpu else None
    value = {"predicted_peak_bytes": prediction.peak, "predicted_allocated_bytes": prediction.allocated,
             "parts": dict(prediction.parts), "device_bytes": device}  # fmt: skip
    where = f" of the {gib(device)} of the {cfg.hardware.gpu_name}" if device else " (planned as on a GPU)"
    off = "; TRAIN_MEMORY_CHECK=off: not refused if over" if cfg.settings.memory_check == "off" else ""
    return Decision(value, f"predicted {gib(prediction.peak)} per process{where} (trainer.memory.predict; error on "
                           f"GPUs unmeasured); peak_mem_bytes in metrics.jsonl is the measured allocator peak{off}")


def largest_batch(plan: Plan, limit: int, ceiling: int) -> tuple[int, int]:
    """(the largest micro-batch in 1..ceiling whose predicted allocator peak stays at most `limit`, the predicted
    bytes per sequence): where the batch search (trainer/run/batch_search.py) starts, and the line it confirms. The
    peak is linear in the batch: two predictions draw the line."""
    one, two = predict_model(replace(plan, batch=1)).allocated, predict_model(replace(plan, batch=2)).allocated
    slope = max(two - one, 1)
    return max(1, min(ceiling, 1 + (limit - one) // slope)), slope
