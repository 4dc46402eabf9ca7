"""The run-time changes trainkit makes to the libraries it calls, each with its reason and its scope.

trainer.compat says what an installed stack can do; this module changes how the libraries behave for one run:
a shim an older torch lacks, a guard lifted for the run's own checkpoint, a save keeping the model's own names, and
the imports a run without DeepSpeed or without an adapter does not pay for. Importing it imports neither torch nor
transformers.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import Iterator
from typing import Any

from trainer.compat import Stack, stack

log = logging.getLogger("trainer")


def install_torch_shims() -> None:
    """Fill in what the pinned libraries call but an older torch lacks. Call before TrainingArguments is built.

    accelerate 1.10 sets the device of each CPU process with torch.cpu.set_device (torch >= 2.2); a CPU is one
    device, so on torch 2.1 a no-op stands in (multi-process CPU training, e.g. torchrun over gloo).
    """
    import torch

    if not hasattr(torch.cpu, "set_device"):
        torch.cpu.set_device = lambda device: None


@contextlib.contextmanager
def resuming_from(checkpoint: str | None, st: Stack | None = None) -> Iterator[None]:
    """Around `trainer.train(resume_from_checkpoint=...)`: where transformers refuses torch.load on this torch
    (`refuses_torch_load`), every resume would fail, so its guard is lifted for the checkpoint being resumed (one the
    run's own output dir holds and marked complete, or the folder TRAIN_RESUME names), and said so in the log."""
    st = st or stack()
    if checkpoint is None or not st.refuses_torch_load:
        yield
        return
    import transformers.trainer as hf_trainer

    log.warning("resume: %s refuses torch.load on torch < 2.6 (CVE-2025-32434); loading the optimizer, scheduler and "
                "RNG state of %s anyway: resume only checkpoints you trust", st.describe(), checkpoint)  # fmt: skip
    guard = hf_trainer.check_torch_load_is_safe
    hf_trainer.check_torch_load_is_safe = lambda: None
    try:
        yield
    finally:
        hf_trainer.check_torch_load_is_safe = guard


@contextlib.contextmanager
def saving_in_model_names(*models: Any) -> Iterator[None]:
    """Around a checkpoint's save: its weights under the model's own parameter names. Transformers 5 renames some
    families' weights back to their original checkpoint layout when it saves (vision-language models'
    `model.language_model.` becomes `model.`), and its Trainer's resume loads a checkpoint with load_state_dict,
    which does not rename them again: those weights would be missing, and the run would go on from fresh ones.
    save_pretrained's save_original_format=False keeps the names; 4.x renames nothing."""
    import inspect

    patched = [m for m in dict.fromkeys(models) if hasattr(type(m), "save_pretrained")
               and "save_original_format" in inspect.signature(type(m).save_pretrained).parameters]  # fmt: skip
    for model in patched:
        model.save_pretrained = functools.partial(type(model).save_pretrained, model, save_original_format=False)
    try:
        yield
    finally:
        for model in patched:
            del model.save_pretrained


def skip_deepspeed_import(uses_deepspeed: bool) -> None:
    """A run without DeepSpeed never imports it. accelerate's unwrap_model imports deepspeed (and, through its
    autotuner, MLflow) on every call where the package is installed, to test whether the model is a DeepSpeedEngine:
    about 1.5 CPU-seconds of every run's start on a 2-core machine (a one-step tiny run: 11.1 against 9.5), for a
    type such a run cannot hold. A DeepSpeed run (in the same process or not) gets accelerate's own test back."""
    import accelerate.utils.other
    from accelerate.utils.imports import is_deepspeed_available

    accelerate.utils.other.is_deepspeed_available = is_deepspeed_available if uses_deepspeed else lambda: False


def _peft_hidden() -> bool:
    return False


def skip_peft_import(uses_peft: bool) -> None:
    """A process that holds no adapter never imports PEFT. Where peft is installed, Transformers' trainer_utils and
    trainer, and TRL's trainers, import it at their own import to tell a PeftModel apart; PEFT imports bitsandbytes,
    whose kernels' wrappers call torch.compile at import. About 0.9 CPU-seconds of a tiny run on a 2-core machine
    (8.5 against 7.6, two pairs) and 0.8 of `trainer config` (6.9 against 6.1), for a type a run without TRAIN_LORA
    never builds: such a process sees Transformers' is_peft_available say no. Call before Transformers' trainer
    modules are imported (and after the refusals made before torch: importing transformers.utils imports it).

    `uses_peft` gives Transformers' own test back; where its trainer modules were already imported with PEFT hidden
    (an earlier run in the same process), they would take an adapter for a plain model (and save it whole): that is
    refused (RuntimeError), never trained on."""
    import transformers.utils
    from transformers.utils import import_utils

    if not uses_peft:
        transformers.utils.is_peft_available = _peft_hidden
        return
    transformers.utils.is_peft_available = import_utils.is_peft_available
    imported_without = [name for name in ("transformers.trainer_utils", "transformers.trainer")
                        if getattr(sys.modules.get(name), "is_peft_available", None) is _peft_hidden]  # fmt: skip
    if imported_without:
        raise RuntimeError(f"{', '.join(imported_without)} imported with PEFT hidden (skip_peft_import) earlier in "
                           "this process: an adapter run needs a new process")  # fmt: skip
