"""`python -m trainer export SRC OUT [--adapter-only] [--dtype D] [--base B]`: a plain Transformers model folder.

OUT gets safetensors weights, config.json, generation_config.json, the run's tokenizer (with its chat template) and a
README.md model card. It is written to a staging folder next to OUT, loaded back with AutoModelForCausalLM (no peft)
and its logits on a probe input compared with the reference (base + adapter through PEFT, or the unsharded model);
only then is it renamed to OUT. A mismatch exits 1 naming the difference; a wrong SRC or OUT exits 2. SIGTERM or
Ctrl-C removes the staging folder (exit 128+N); a second export into the same OUT meanwhile exits 2 naming the first.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from trainer.config.precision import DTYPE_NAMES
from trainer.errors import EXIT_CRASH, EXIT_OK, ConfigError
from trainer.hub.weights import DIVERGED_HINT, check_weights, first_nonfinite

log = logging.getLogger("trainer")
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")


def register(parser: argparse.ArgumentParser) -> None:
    """`export`'s arguments, on the parser trainer/__main__.py made for it (trainer/commands.py)."""
    parser.description = (
        "Write OUT: a model folder for from_pretrained (safetensors, config, generation config, the run's "
        "tokenizer and chat template, a README model card). SRC is a run folder (its final/, else its newest "
        "complete checkpoint), a checkpoint-N folder or final/. A LoRA adapter is merged into the base the run "
        "recorded (a quantized base is loaded unquantized in the run's compute dtype); ZeRO and FSDP shards are "
        "consolidated. The result is verified (its logits equal the source's) before it is published."
    )
    parser.add_argument("src", metavar="SRC", help="a run folder, a checkpoint-N folder or final/")
    parser.add_argument("out", metavar="OUT", help="the folder to write (must not exist, or be empty)")
    parser.add_argument("--adapter-only", action="store_true", help="keep the LoRA adapter instead of merging it")
    parser.add_argument(
        "--dtype", choices=["auto", *DTYPE_NAMES], default="auto",
        help="weights' dtype (auto: the run's compute dtype for LoRA, else the weights' own)",
    )  # fmt: skip
    parser.add_argument(
        "--base", help="the LoRA base model (a folder or org/name@revision) instead of the recorded one"
    )
    from trainer.export.options import add_quant_arguments

    add_quant_arguments(parser)
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from trainer.errors import Interrupted, raise_on_stop_signals
    from trainer.export.options import quant_request
    from trainer.export.quant import QualityLoss
    from trainer.export.verify import ExportMismatch
    from trainer.logs import setup_logging
    from trainer.output_lock import lock_beside

    raise_on_stop_signals()  # SIGTERM as Ctrl-C: the staging folder is removed, OUT never half-written
    setup_logging()
    out = Path(args.out)
    lock_beside(out, "export", f"export OUT={out}")  # two exports into one OUT would share one staging folder
    try:
        out = export(Path(args.src), out, args.adapter_only, args.dtype, args.base, quant=quant_request(args))
    except Interrupted:
        print(f"export interrupted: {out} was not written (nothing published; the staging folder is removed)",
              file=sys.stderr)  # fmt: skip
        raise
    except ExportMismatch as exc:
        print(f"error: export not verified: {exc}", flush=True)
        log.error("export not verified: %s", exc)
        return EXIT_CRASH
    except QualityLoss as exc:
        print(f"error: export not published: quality gate failed: {exc}", flush=True)
        log.error("export not published (%s removed): quality gate failed: %s", out, exc)
        return EXIT_CRASH
    print(f"exported {out}")
    return EXIT_OK


def _check_out(out: Path, replace: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"export OUT={out}: a file is in the way; give a folder")
    if out.is_dir() and any(out.iterdir()) and not replace:
        raise ConfigError(f"export OUT={out}: the folder is not empty; give a new folder (nothing was overwritten)")


def export(src: Path, out: Path, adapter_only: bool = False, dtype: str = "auto", base: str | None = None,
           replace: bool = False, quant: Any = None) -> Path:  # fmt: skip
    """Build, write, verify and publish OUT (see the module docstring); returns OUT. `quant` (a QuantRequest):
    the quantized files, made and gated in the staging folder before it is published (trainer/export/quant.py)."""
    from trainer.export import quant as quantized
    from trainer.export.source import resolve_source

    source = resolve_source(src, adapter_only)
    _check_out(out, replace)
    plan = quantized.plan_request(quant, source, adapter_only)
    for folder in (source.folder, source.adapter):  # a damaged file or a diverged run's NaN: exit 2, naming it
        if folder is not None:
            check_weights(folder, f"export {src}")
    staging = out.parent / f".tmp-export-{out.name}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        _build(source, staging, adapter_only, dtype, base, out.name)
        if plan is not None:
            quantized.produce(plan, staging, out.name, source.run, source.run_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    os.rename(staging, out)
    return out


def _tokenizer(*folders: Path | str | None) -> Any:
    from transformers import AutoTokenizer

    for folder in folders:
        if folder and (Path(folder) / "tokenizer_config.json").is_file():
            return AutoTokenizer.from_pretrained(str(folder))
    return None


def _build(source: Any, staging: Path, adapter_only: bool, dtype: str, base: str | None, name: str) -> None:
    from trainer.export import consolidate, merge, model_card, verify
    from trainer.export.source import ADAPTER, FSDP, ZERO
    from trainer.model.adapters import merged

    if adapter_only and source.kind != ADAPTER:
        raise ConfigError(f"export --adapter-only: {source.folder} holds no LoRA adapter")
    if adapter_only:
        return _copy_adapter(source, staging, name)
    base_how = None
    if source.kind == ADAPTER:
        folder, base_how = merge.base_folder(source, base)
        tokenizer = _tokenizer(source.folder, source.adapter, folder)
        dtype_name = DTYPE_NAMES.get(dtype) or merge.run_dtype_name(source)
        reference_model = merge.load_base(folder, merge.run_dtype_name(source), source.run, source.adapter,
                                          tokenizer)  # fmt: skip
        log.info("export: merging the adapter %s into %s", source.adapter, base_how)
        model = merged(reference_model)
    elif source.kind in (ZERO, FSDP):
        state = consolidate.zero_state_dict(source.folder) if source.kind == ZERO else consolidate.fsdp_state_dict(
            source.folder)  # fmt: skip
        model = consolidate.model_from_state_dict(source.folder, state)
        reference_model = _unsharded_reference(source.folder) or model
        tokenizer = _tokenizer(source.folder)
        dtype_name = DTYPE_NAMES.get(dtype) or "float32"
    else:
        reference_model = model = _load_full(source.folder)
        tokenizer = _tokenizer(source.folder)
        dtype_name = DTYPE_NAMES.get(dtype) or str(model.dtype).removeprefix("torch.")
    bad = first_nonfinite(model.state_dict().items())  # what consolidating or merging made
    if bad:
        raise ConfigError(f"export {source.folder}: the model holds non-finite weights, first in {bad!r}: "
                          f"{DIVERGED_HINT}")  # fmt: skip
    ids = verify.probe_ids(tokenizer, model.config.vocab_size)
    reference = verify.logits(reference_model, ids)
    _save(model, tokenizer, staging, dtype_name)
    (staging / "README.md").write_text(model_card.model_card(source, name, base_how, source.kind == ADAPTER))
    diff = verify.verify(staging, reference, ids, dtype_name)
    log.info("export: %s (%s, %s) loads without peft; logits within %.2g of the reference", name, source.kind,
             dtype_name, diff)  # fmt: skip


def _unsharded_reference(folder: Path) -> Any:
    """The 16-bit weights DeepSpeed gathered into the checkpoint (stage3_gather_16bit_weights_on_model_save), if any:
    an independent reference for the consolidated fp32 master weights."""
    if not any(folder.glob("model*.safetensors")):
        return None
    return _load_full(folder)


def _load_full(folder: Path) -> Any:
    from trainer.model.loading import LoadHow, Weights, load

    return load(Weights(folder=str(folder)), LoadHow(dtype=None))  # Transformers' default dtype, as verify reloads


def _save(model: Any, tokenizer: Any, staging: Path, dtype_name: str) -> None:
    import torch

    model = model.to(getattr(torch, dtype_name))
    model.save_pretrained(str(staging))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(staging))


def _copy_adapter(source: Any, staging: Path, name: str) -> None:
    from safetensors.torch import load_file

    from trainer.export import adapter_layout, model_card

    for file in ADAPTER_FILES:
        if (source.adapter / file).is_file():
            shutil.copy2(source.adapter / file, staging / file)
    tokenizer = _tokenizer(source.folder, source.adapter)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(staging))
    (staging / "README.md").write_text(model_card.model_card(source, name, None, False))
    weights = staging / "adapter_model.safetensors"
    if not weights.is_file() or not load_file(str(weights)):
        raise ConfigError(f"export --adapter-only: {source.adapter} holds no adapter_model.safetensors weights")
    adapter_layout.check(staging, source.adapter)
    log.info("export: %s holds the LoRA adapter of %s (--adapter-only), %d tensors", name, source.adapter,
             len(load_file(str(weights))))  # fmt: skip
