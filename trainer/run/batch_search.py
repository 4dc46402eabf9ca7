"""TRAIN_AUTO_BATCH: the largest per-device batch that fits with headroom, found before training, alike on every rank.

The probe. One real forward and backward pass of the model at a candidate batch (random token ids, TRAIN_SEQ_LEN
long, under the run's autocast and activation checkpointing), with the optimizer's state held aside as one
allocation of its size (AdamW: two fp32 values per trainable parameter; with several ranks, one more for DDP's
gradient buckets). It reports whether the device ran out of memory and, where it did not, the peak memory allocated
(the allocator's statistics), and frees everything it allocated.

The search (trainer/run/batch_fit.py): two probes give the line of peak memory against the batch, a third confirms
the largest batch the line keeps under the allocator's capacity less a headroom. Each verdict and peak is agreed by
every rank before the next size is chosen (a MIN all-reduce over the CPU gloo group of the stop agreement): all
ranks probe the same sizes and end on the same batch, and a rank that runs out of memory never leaves the others
waiting.

The model probed is the model that trains: with torch.compile on, the probe runs the model compiled with the run's
backend and mode (or as it is, where it was compiled in place), with the batch dimension marked dynamic, so one
compile serves every size and the compiled forward and backward set the memory. After a compiled search dynamo's
graphs are dropped, so that training compiles (or reads from the inductor cache) the static graph at the chosen
batch rather than running the search's dynamic one. Where compiling the probe fails (not an out-of-memory), the
search probes the eager model and its reason says so: eager activations are the larger, so the batch found is one
that fits, possibly smaller than the compiled model could take.
After the search the device's peak-memory statistics are reset: `peak_mem_bytes` is the training steps' peak.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.memory.fit import largest_batch, memory_decision, plan_of
from trainer.memory.predict import Plan
from trainer.run.batch_fit import (
    GIB,
    HEADROOM,
    DeviceMemory,
    Probe,
    Probed,
    Search,
    agreed,
    agreed_limit,
    device_memory,
    memory_limit,
    search_predicted,
)

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup
    from torch.nn import Module
    from transformers import TrainingArguments

    from trainer.config.decision import Decision, Decisions
    from trainer.config.run_config import RunConfig
    from trainer.config.schema import TrainSettings

log = logging.getLogger("trainer")

MAX_BATCH = 4096


def optimizer_state_bytes(model: Module, world_size: int) -> int:
    """Bytes the optimizer state (and DDP's gradient buckets) will take on the device once training starts."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable * (8 + (4 if world_size > 1 else 0))


def memory_probe(
    model: Module,
    seq_len: int,
    vocab_size: int,
    device: torch.device,
    precision: str,
    reserve: int,
    memory: DeviceMemory,
    forward: Any = None,
) -> Probe:
    """probe(batch): one forward and backward pass at `batch` on `device`: whether it ran without running out of
    memory, and its peak as `memory` measured it. `forward`: the callable that runs the model (the compiled model,
    whose batch dimension is then marked dynamic so one compile serves every size); the model itself where not
    given."""
    import torch

    from trainer.config.precision import compute_dtype

    dtype = compute_dtype(precision)
    run = model if forward is None else forward
    regional = forward is model and getattr(model, "_compiled_call_impl", None) is None  # its layers compiled

    def probe(batch: int) -> Probed:
        held = ids = loss = None
        memory.reset_peak()
        try:
            held = torch.empty(reserve, dtype=torch.uint8, device=device)
            ids = torch.randint(0, vocab_size, (batch, seq_len), device=device)
            dynamic = forward is not None and batch > 1  # a size of 1 is specialised by dynamo: it compiles apart
            if dynamic:
                torch._dynamo.mark_dynamic(ids, 0)
            mixed = dtype != torch.float32
            autocast = torch.autocast(device.type, dtype=dtype) if mixed else contextlib.nullcontext()
            with autocast, layers_see_a_dynamic_batch(model, dynamic and regional):
                loss = run(input_ids=ids, labels=ids).loss
            loss.backward()
            result = Probed(True, memory.peak())
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            result = Probed(False)
        finally:  # the tensors, the gradients, the failed try's frames (gc), then the allocator's cache
            del held, ids, loss
            model.zero_grad(set_to_none=True)
            if device.type == "cuda":
                gc.collect()
                torch.cuda.empty_cache()
        said = f"peak {result.peak / GIB:.2f} GiB" if result.fits else "out of memory"
        log.info("auto batch: probe at %d sequences: %s", batch, said)
        return result

    return probe


@contextlib.contextmanager
def layers_see_a_dynamic_batch(model: Module, on: bool) -> Iterator[None]:
    """With the decoder layers compiled in place, the hidden states the embeddings hand them are what their graph
    sees: marked dynamic in the batch, one compile serves every probed size (the token ids never reach the layers)."""
    if not on:
        yield
        return
    import torch

    def mark(_module: Any, _args: Any, output: Any) -> None:
        torch._dynamo.mark_dynamic(output, 0)

    handle = model.get_input_embeddings().register_forward_hook(mark)
    try:
        yield
    finally:
        handle.remove()


ALLOCATION_FAILURES = ("CUDA error: out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")


def is_out_of_memory(exc: BaseException | None) -> bool:
    """Whether `exc` means the batch did not fit: torch's out-of-memory error, every form Accelerate's batch-size
    finder reduces the batch for (a "CUDA error: out of memory" from a kernel, cuDNN's NOT_SUPPORTED at a size),
    and the cuBLAS and cuDNN workspace allocation failures."""
    from accelerate.utils.memory import should_reduce_batch_size

    from trainer.compat import out_of_memory_error

    while exc is not None:  # a compiler's error may wrap the allocator's (BackendCompilerFailed from autotuning)
        if isinstance(exc, out_of_memory_error()) or (isinstance(exc, Exception) and should_reduce_batch_size(exc)):
            return True
        if isinstance(exc, RuntimeError) and any(code in str(exc) for code in ALLOCATION_FAILURES):
            return True
        exc = exc.__cause__
    return False


def compiled_in_place(model: Module) -> bool:
    """Whether `model` or one of its modules was compiled in place (`Module.compile`, regional compilation)."""
    return any(getattr(m, "_compiled_call_impl", None) is not None for m in model.modules())


def compiled_like_training(model: Module, settings: TrainSettings) -> Any:
    """The model as the run's torch.compile runs it: compiled with TRAIN_COMPILE_BACKEND and TRAIN_COMPILE_MODE (as
    Accelerate compiles it for Trainer), or the model itself where its modules were compiled in place."""
    import torch

    if compiled_in_place(model):
        return model
    return torch.compile(model, backend=settings.compile_backend, mode=settings.compile_mode)


def search_batch(
    model: Module,
    settings: TrainSettings,
    device: torch.device,
    precision: str,
    reserve: int,
    ceiling: int,
    group: ProcessGroup | None,
    compiled: bool,
    memory: DeviceMemory,
    limit: int,
    start: int,
    slope: int = 0,
) -> tuple[Search, str]:
    """The search over `model` as it trains (compiled when `compiled`), and how it was probed (for the reason).
    A compiled probe that fails for another reason than memory gives way to the eager model, and says why. After a
    compiled search dynamo's graphs are dropped: training then compiles the static graph at the batch chosen."""
    import torch

    vocab = model.get_input_embeddings().weight.shape[0]
    probe = functools.partial(memory_probe, model, settings.seq_len, vocab, device, precision, reserve, memory)

    def search(probing: Probe) -> Search:
        return search_predicted(agreed(probing, group), start, ceiling, limit, slope)

    if not compiled:
        return search(probe()), "probed eager (TRAIN_COMPILE off)"
    try:
        found = search(probe(forward=compiled_like_training(model, settings)))
        how = (f"probed compiled as the run compiles it (backend {settings.compile_backend}, mode "
               f"{settings.compile_mode}; one compile, the batch dimension dynamic; training compiles the static "
               "graph at the batch chosen)")  # fmt: skip
    except Exception as exc:  # any compile failure: the eager model is still a safe bound
        torch._dynamo.reset()
        model.zero_grad(set_to_none=True)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        log.warning("auto batch: compiling the probe failed (%s); probing the eager model", first[:300])
        how = (f"probed eager: compiling the probe failed ({first[:200]}); eager activations take more memory "
               "than compiled ones, so a larger batch may fit the compiled run")  # fmt: skip
        return search(probe()), how
    torch._dynamo.reset()  # the search's dynamic graphs: training compiles (or reads) the static one at its batch
    return found, how


def batch_ceiling(blocks: int, world_size: int, effective: int | None) -> int:
    """The largest batch worth trying: the blocks one rank gets, the effective batch when set, MAX_BATCH."""
    return max(1, min(MAX_BATCH, blocks // max(world_size, 1), effective or MAX_BATCH))


def choose_batch(
    model: Module,
    args: TrainingArguments,
    settings: TrainSettings,
    precision: str,
    blocks: int,
    group: ProcessGroup | None,
    effective: int | None = None,
    compiled: bool = False,
    plan: Plan | None = None,
) -> Decision[int]:
    """The Decision for the per-device batch (at most `effective` when given); `model` is moved to args.device
    (where Trainer would put it). The search starts from the largest batch `plan`'s memory prediction keeps under
    the limit (trainer.memory.fit), else from TRAIN_BATCH_SIZE."""
    from trainer.config.decision import Decision
    from trainer.errors import ConfigError

    ceiling = batch_ceiling(blocks, args.world_size, effective)
    memory = device_memory(args.device)
    if memory is None:
        reason = "TRAIN_AUTO_BATCH=1 needs a GPU (a CPU has no out-of-memory error to search against); TRAIN_BATCH_SIZE"
        log.warning("auto batch: no GPU, so the batch stays TRAIN_BATCH_SIZE=%d", settings.batch_size)
        return Decision(settings.batch_size, reason)
    if not (getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)):
        model.to(args.device)
    checkpointing = settings.grad_ckpt and not model.is_gradient_checkpointing
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    limit = agreed_limit(memory_limit(memory), group)
    reserve = optimizer_state_bytes(model, args.world_size)
    if plan is not None and args.device.type != "cuda":
        plan = None  # the prediction is in a GPU's bytes (a stand-in device for tests counts its own)
    start, slope = largest_batch(plan, limit, ceiling) if plan is not None else (settings.batch_size, 0)
    log.info("auto batch: starting from %d (%s)", start, "the memory prediction's largest batch under the limit"
             if plan is not None else "TRAIN_BATCH_SIZE")  # fmt: skip
    found, how = search_batch(model, settings, args.device, precision, reserve, ceiling, group, compiled, memory,
                              limit, start, slope)  # fmt: skip
    if plan is not None:
        how += f"; started from the memory prediction's largest batch, {start}"
    if checkpointing:
        model.gradient_checkpointing_disable()  # Trainer switches it on again from TrainingArguments
    if found.batch == 0:
        raise ConfigError(
            f"TRAIN_AUTO_BATCH=1: not even a batch of 1 fits in GPU memory with {HEADROOM:.0%} of it kept free at "
            f"TRAIN_SEQ_LEN={settings.seq_len}; "
            "lower TRAIN_SEQ_LEN, or use TRAIN_GRAD_CKPT=1, TRAIN_LORA=1 or sharding (TRAIN_FSDP, TRAIN_ZERO_STAGE)"
        )
    reason = f"{found.reason(ceiling)}; {how}"
    log.info("auto batch: %d per device (%s)", found.batch, reason)
    return Decision(found.batch, reason)


def search_key(cfg: RunConfig, args: Any, model: Module, memory: DeviceMemory) -> dict[str, Any]:
    """What the batch that fits depends on: the model and its trainable part, TRAIN_SEQ_LEN, the precision, attention,
    compile, Liger and checkpointing decisions, the processes, the GPU and the versions."""
    import accelerate
    import torch
    import transformers

    from trainer.run.training_model import count_parameters

    s, d = cfg.settings, cfg.decisions
    return {
        "model": s.model, "parameters": count_parameters(model), "seq_len": s.seq_len,
        "precision": d.precision.value, "attn": d.attn.value, "liger": d.liger.value, "grad_ckpt": s.grad_ckpt,
        "compile": f"{s.compile_scope}/{s.compile_backend}/{s.compile_mode}" if d.compile.value else "off",
        "lora": s.lora, "quant": s.quant, "optim": d.optim.value, "world_size": args.world_size, "gpu": memory.name,
        "gpu_memory": memory.total, "headroom": HEADROOM,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "accelerate": accelerate.__version__},
    }  # fmt: skip


def search_cache_file(key: dict[str, Any], environ: Mapping[str, str]) -> Path:
    """Where the search's result for `key` is kept: beside the compile cache (the images' /cache volume, from
    source HF_HOME/../torch-compile/), so a restarted run, or a run into a new output folder, finds it."""
    import hashlib
    import json

    from trainer.config.speed import compile_environment

    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    inductor = Path(compile_environment(environ, "layers")["TORCHINDUCTOR_CACHE_DIR"])
    return inductor.parent / "batch-search" / f"{digest}.json"


def cached_batch(path: Path, key: dict[str, Any]) -> tuple[int, str] | None:
    """(batch, reason) a search with the same key found before; None when there is none (or it is unreadable)."""
    import json

    try:
        record = json.loads(path.read_text())
        if record["key"] == key and int(record["batch"]) > 0:
            return int(record["batch"]), str(record["reason"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return None


def remember_batch(path: Path, key: dict[str, Any], batch: int, reason: str) -> None:
    import json
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"key": key, "batch": batch, "reason": reason}, indent=1))
    os.replace(tmp, path)  # complete or absent: a run stopped mid-write leaves no half record


def searched_or_cached(cfg: RunConfig, args: TrainingArguments, model: Module, search: Callable[[], Decision[int]],
                       ceiling: int) -> Decision[int]:  # fmt: skip
    """The search's Decision, from the cache where the same model, sequence length, precision, GPU and versions
    were searched before (every rank takes rank 0's cache verdict), else searched and remembered by rank 0."""
    from trainer.config.decision import Decision
    from trainer.run.signals import from_rank_0

    memory = device_memory(args.device)
    if memory is None:
        return search()
    import json
    import os

    key = json.loads(json.dumps({**search_key(cfg, args, model, memory), "ceiling": ceiling}))  # as read back
    path = search_cache_file(key, os.environ)
    hit = from_rank_0(cached_batch(path, key) if args.process_index == 0 else None, args.world_size)
    if hit is not None:
        batch, earlier = hit
        log.info("auto batch: %d per device, cached in %s (no search)", batch, path)
        why = (
            f"TRAIN_AUTO_BATCH: the cached result of an earlier search for this model, sequence length, precision, "
            f"GPU and versions ({path}; delete it to search again): {earlier}"
        )
        return Decision(batch, why)
    decision = search()
    if args.process_index == 0:
        remember_batch(path, key, decision.value, decision.reason)
    return decision


def predicted_plan(cfg: RunConfig) -> Plan | None:
    """The run's memory plan (trainer.memory.fit), None where its model's shape cannot be read."""
    try:
        return plan_of(cfg)
    except (OSError, KeyError, ValueError):
        return None


def split_effective(effective: int, largest: int) -> tuple[int, int]:
    """(micro-batch, accumulation steps) whose product is `effective`, with the largest micro-batch <= `largest`."""
    micro = next(size for size in range(max(1, min(largest, effective)), 0, -1) if effective % size == 0)
    return micro, effective // micro


def apply_auto_batch(
    cfg: RunConfig, args: TrainingArguments, model: Module, blocks: int, resume: Path | None
) -> Decisions:
    """The TRAIN_AUTO_BATCH search: the batch the ranks agreed on replaces TRAIN_BATCH_SIZE in `args`; when the user
    set TRAIN_BATCH_SIZE or TRAIN_GRAD_ACCUM, gradient accumulation keeps their product (the effective batch). The
    decisions with the searched batch (and the sizes probed) are returned, for the run's record; the log says the
    effective batch.
    A resumed run keeps its checkpoint's batch, so the samples it skips are the ones it trained on."""
    import dataclasses

    from trainer.checkpoint_record import recorded_batch_size
    from trainer.config.decision import Decision
    from trainer.config.optim import effective_batch_set
    from trainer.run.metrics import reset_peak_memory
    from trainer.run.signals import control_group

    s = cfg.settings
    effective = s.batch_size * s.grad_accum if effective_batch_set(s) else None
    previous = recorded_batch_size(resume) if resume else None
    if previous:
        decision = Decision(previous, f"TRAIN_AUTO_BATCH: the batch of the checkpoint resumed from ({resume})")
        log.info("auto batch: %d per device, as in %s", decision.value, resume)
    else:
        precision = cfg.decisions.precision.value
        group = control_group(args.world_size)
        ceiling = batch_ceiling(blocks, args.world_size, effective)
        plan = predicted_plan(cfg)
        compiled = cfg.decisions.compile.value
        decision = searched_or_cached(cfg, args, model, lambda: choose_batch(
            model, args, s, precision, blocks, group, effective, compiled, plan), ceiling)  # fmt: skip
    reset_peak_memory()  # the probes' peak is not the training steps' (peak_mem_bytes)
    micro, accum = split_effective(effective, decision.value) if effective else (decision.value, s.grad_accum)
    if effective:
        why = f"TRAIN_BATCH_SIZE x TRAIN_GRAD_ACCUM = {effective} kept: {micro} x {accum} accumulation steps"
        decision = Decision(micro, f"{decision.reason}; {why}")
        accum_decision = Decision(accum, f"TRAIN_AUTO_BATCH: {why}")
    else:
        accum_decision = Decision(accum, "set by TRAIN_GRAD_ACCUM (TRAIN_BATCH_SIZE not set: the search may change the "
                                         "effective batch)")  # fmt: skip
    log.info("auto batch: effective batch %d sequences per step (%d per device x %d accumulation x %d processes)%s",
             micro * accum * args.world_size, micro, accum, args.world_size,
             "" if effective else "; TRAIN_BATCH_SIZE was not set, so the search chose it")  # fmt: skip
    args.per_device_train_batch_size = micro
    args.gradient_accumulation_steps = accum
    decisions = dataclasses.replace(cfg.decisions, batch_size=decision, grad_accum=accum_decision)
    return dataclasses.replace(decisions, memory=memory_decision(dataclasses.replace(cfg, decisions=decisions)))
