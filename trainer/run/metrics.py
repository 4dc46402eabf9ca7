"""metrics.jsonl: one JSON object per logging step, written by the main process only.

Keys (a contract; benchmarks read them): step, epoch, loss, lr, grad_norm, tokens_per_s,
samples_per_s, step_time_s, peak_mem_bytes, predicted_peak_mem_bytes, mfu, time.

- step_time_s: mean wall time of the optimizer steps since the previous log line, measured between
  consecutive step ends (data loading included, checkpoint saves excluded).
- samples_per_s / tokens_per_s: global (all ranks) = per-device batch x grad accum x world size / step time;
  tokens_per_s counts useful tokens only: padding (records packing fills each sequence's tail with it) is left out,
  as the training data's share of it (meta.json's packing statistics); so is the MFU computed from it.
- peak_mem_bytes: peak CUDA memory allocated by this process on GPUs; peak resident memory (RSS) on CPU; the peak of
  the training steps: the statistics are reset after the batch search and after each evaluation.
- predicted_peak_mem_bytes: on GPUs, the allocator's peak the memory prediction gave for this run's batch before the
  model loaded (trainer.memory.predict: its parts less the framework's allowance), beside the measured
  peak_mem_bytes, so the prediction's error is known per GPU and stack; null on CPU.
- mfu: model FLOPs utilization on known GPUs, null on CPU and unknown GPUs. FLOPs per token are
  6 x N (N = parameters taking part in matmuls: all but the input embedding) + 12 x layers x hidden x
  seq_len (attention scores, PaLM appendix B), divided by the dense bf16/fp16 peak of the GPU.

Every line is strict JSON (RFC 8259): a non-finite value (a diverged run's NaN loss or grad norm) is written as
null, never as a bare NaN/Infinity and never as 0.0; the log names the step (trainer.run.divergence).
"""

from __future__ import annotations

import json
import logging
import math
import resource
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from trainer.jsonl import append_line, json_line
from trainer.model.components import param_numel

if TYPE_CHECKING:
    from torch.nn import Module
    from transformers import TrainerControl, TrainerState, TrainingArguments

log = logging.getLogger("trainer")

METRIC_KEYS = (
    "step",
    "epoch",
    "loss",
    "lr",
    "grad_norm",
    "tokens_per_s",
    "samples_per_s",
    "step_time_s",
    "peak_mem_bytes",
    "predicted_peak_mem_bytes",
    "mfu",
    "time",
)


def matmul_params(model: Module, trainable_only: bool = False) -> int:
    """Parameters that take part in matmuls: all unique ones except the input embedding (a lookup), unless it
    is tied to the LM head. `trainable_only`: those that also get a weight gradient."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    emb = base.get_input_embeddings().weight
    head = base.get_output_embeddings()
    tied = head is not None and head.weight is emb
    return sum(
        param_numel(p)
        for p in base.parameters()
        if (tied or p is not emb) and (p.requires_grad or not trainable_only)
    )


def flops_per_token(model: Module, seq_len: int) -> float:
    """Training FLOPs per token: per matmul weight 2 forward and 2 for the input gradient, plus 2 for the weight
    gradient only where the weight trains (6N for full fine-tuning, about 4N for LoRA/QLoRA, whose frozen weights
    skip it); attention scores add 12 * layers * hidden * seq_len (forward and backward, no weights)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = base.config
    layers = getattr(cfg, "num_hidden_layers", 0)
    hidden = getattr(cfg, "hidden_size", 0)
    weights = 4.0 * matmul_params(model) + 2.0 * matmul_params(model, trainable_only=True)
    return weights + 12.0 * layers * hidden * seq_len


def peak_memory_bytes() -> int:
    """Peak CUDA memory allocated on a GPU; the peak resident memory on a CPU. Both since the last
    reset_peak_memory()."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.max_memory_allocated())
    hwm = _status_kib("VmHWM")
    if hwm is not None:
        return hwm * 1024
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def reset_peak_memory() -> None:
    """Start the peak over from what is in use now (after the batch search, after evaluation): Linux resets a
    process's peak resident memory when "5" is written to /proc/self/clear_refs."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()
        return
    _return_freed_heap()  # freed probe tensors glibc still holds would otherwise count as resident
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        log.debug("peak resident memory cannot be reset here: peak_mem_bytes keeps the process's peak")


def _return_freed_heap() -> None:
    """glibc's malloc_trim: give the heap's free pages back to the system (a no-op where libc has none)."""
    import contextlib
    import ctypes
    import ctypes.util

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def finite_float(x: Any) -> float | None:
    """A finite float, else None (written as null)."""
    if x is None:
        return None
    try:
        value = float(x)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


class MetricsCallback(TrainerCallback):
    """Appends one line to metrics.jsonl per logging step (rank 0 only)."""

    def __init__(self, path: Path, seq_len: int, flops_per_token: float, peak_flops: float | None,
                 predicted_peak: int | None = None, router: Any = None) -> None:  # fmt: skip
        self.path = path
        self.router = router  # a mixture of experts' RouterMetrics: its share matrix joins each line
        self.predicted_peak = predicted_peak
        self.seq_len = seq_len
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops
        self._last: float | None = None
        self._step_times: list[float] = []
        self.useful_share = 1.0  # of the tokens trained, those that are not padding (on_train_begin)

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        self._last = time.perf_counter()
        loader = kwargs.get("train_dataloader")
        self.useful_share = useful_token_share(getattr(loader, "dataset", None))

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        now = time.perf_counter()
        if self._last is not None:
            self._step_times.append(now - self._last)
        self._last = now

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object) -> None:
        self._last = time.perf_counter()  # the next step's time excludes the save

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        reset_peak_memory()  # evaluation's peak is not a training step's

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs: object) -> None:  # fmt: skip
        if not state.is_world_process_zero or not logs or "loss" not in logs:
            return
        append_line(self.path, json_line(self.record(args, state, logs)))
        self._step_times.clear()

    def record(self, args: TrainingArguments, state: TrainerState, logs: dict[str, Any]) -> dict[str, Any]:
        step_time = sum(self._step_times) / len(self._step_times) if self._step_times else None
        batch = state.train_batch_size or args.per_device_train_batch_size
        samples = batch * args.gradient_accumulation_steps * max(args.world_size, 1)
        samples_per_s = samples / step_time if step_time else None
        tokens_per_s = samples_per_s * self.seq_len * self.useful_share if samples_per_s else None
        mfu = None
        if tokens_per_s and self.peak_flops:
            mfu = tokens_per_s / max(args.world_size, 1) * self.flops_per_token / self.peak_flops
        return {
            "step": state.global_step,
            "epoch": finite_float(logs.get("epoch", state.epoch)),
            "loss": finite_float(logs.get("loss")),
            "lr": finite_float(logs.get("learning_rate")),
            "grad_norm": finite_float(logs.get("grad_norm")),
            "tokens_per_s": tokens_per_s,
            "samples_per_s": samples_per_s,
            "step_time_s": step_time,
            "peak_mem_bytes": peak_memory_bytes(),
            "predicted_peak_mem_bytes": self.predicted_peak,
            "mfu": mfu,
            "time": time.time(),
            **method_metrics(logs),
            **self._router_shares(),
        }

    def _router_shares(self) -> dict[str, Any]:
        from trainer.run.router_metrics import SHARES_KEY

        shares = getattr(self.router, "shares", None)
        return {SHARES_KEY: shares} if shares is not None else {}


def useful_token_share(dataset: object) -> float:
    """The share of the training sequences' tokens that are not padding, from the packed data's statistics (a
    held-out split's training part reads its whole dataset's); 1.0 where the data says nothing of padding."""
    base = getattr(dataset, "dataset", dataset)
    meta = getattr(base, "meta", None)
    if not isinstance(meta, dict):
        return 1.0
    packing = meta.get("packing")
    if not packing or not packing.get("padding_tokens"):
        return 1.0
    blocks = int(packing.get("record_blocks", 0)) + int(packing.get("stream_blocks", 0))
    return max(0.0, 1.0 - int(packing["padding_tokens"]) / max(1, blocks * int(meta["seq_len"])))


# The metrics TRL's preference and online trainers log besides their "group/name" ones (rewards/margins,
# rewards/NAME/mean, completions/mean_length, ...).
METHOD_METRIC_NAMES = ("nll_loss", "log_odds_ratio", "log_odds_chosen", "kl", "accuracy", "margin", "mean_reward",
                       "min_reward", "max_reward", "reward", "reward_std", "frac_reward_zero_std",
                       "entropy")  # fmt: skip


def method_metrics(logs: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A preference method's own metrics under TRL's names (`prefix` "eval_" for an evaluation's); none for SFT."""
    return {
        key: finite_float(value) for key, value in logs.items()
        if key.startswith(prefix) and (prefix or not key.startswith("eval_"))
        and ("/" in key or key[len(prefix):] in METHOD_METRIC_NAMES)
    }  # fmt: skip


def truncate_after(path: Path, step: int) -> None:
    """On resume from step K, drop lines for steps after K (written before the interruption)."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line).get("step", 0) <= step:
                kept.append(line)
        except json.JSONDecodeError:
            continue  # a line cut by kill -9
    path.write_text("".join(k + "\n" for k in kept), encoding="utf-8")
