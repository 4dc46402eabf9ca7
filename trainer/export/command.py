"""`python -m trainer export SRC OUT [--adapter-only] [--dtype D] [--base B]`: a plain Transformers model folder.

OUT gets safetensors weights, config.json, generation_config.json, the run's tokenizer (with its chat template) and a
README.md model card. Everything it reads is checked before any work (the options, SRC's files, OUT, the base a LoRA
adapter fits, the tokenizer, the --quant plan): a wrong one exits 2 naming it. It is written to a staging folder
(trainer/export/out_folder.py), loaded back with AutoModelForCausalLM (no peft) and its logits on a probe input
compared with the reference (base + adapter through PEFT: the run's own recorded base where it is here, also under
--base; or the unsharded model); only then is it published as OUT. A mismatch exits 1 naming the difference (exit 2
when it is --base's). A full disk exits 2 naming the filesystem and the space the export needs. SIGTERM or Ctrl-C
removes the staging folder (exit 128+N); a second export into the same OUT meanwhile exits 2 naming the first.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from dataclasses import dataclass
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
    request = quant_request(args)  # every option checked before anything else
    # two exports into one OUT would share one staging folder
    lock_beside(out, "export", f"export OUT={out}", option="OUT")
    try:
        out = export(Path(args.src), out, args.adapter_only, args.dtype, args.base, quant=request)
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


@dataclass(frozen=True)
class Inputs:
    """What the export reads besides SRC, found before any work."""

    tokenizer: Any  # from SRC, its adapter folder or the base (None: SRC holds none)
    base: str | None = None  # the folder a LoRA adapter is merged into
    base_how: str | None = None  # how it was found, for the log and the model card
    recorded_base: str | None = None  # with --base: the run's own recorded base, the merge is checked against it


def export(src: Path, out: Path, adapter_only: bool = False, dtype: str = "auto", base: str | None = None,
           quant: Any = None) -> Path:  # fmt: skip
    """Check, build, write, verify and publish OUT (see the module docstring); returns OUT. Before any work: SRC (a
    damaged file named), OUT, the base an adapter merges into, the tokenizer and `quant` (a QuantRequest: the
    quantized files, made and gated in the staging folder before it is published, trainer/export/quant.py)."""
    from trainer.export import out_folder
    from trainer.export import quant as quantized
    from trainer.export.source import resolve_source
    from trainer.export.verify import ExportMismatch

    source = resolve_source(src, adapter_only)
    out_folder.check(out)
    inputs = _inputs(source, adapter_only, base)
    plan = quantized.plan_request(quant, source, adapter_only, inputs.tokenizer is not None)
    for folder in (source.folder, source.adapter):  # a damaged file or a diverged run's NaN: exit 2, naming it
        if folder is not None:
            check_weights(folder, f"export {src}")
    need = _space_needed(source, inputs, adapter_only, dtype, plan)
    name = out.resolve().name
    staging = out_folder.staging(out)
    with out_folder.removed_on_failure(staging, out, need, (quantized.QualityLoss, ExportMismatch)):
        _build(source, inputs, staging, adapter_only, dtype, name)
        if plan is not None:
            quantized.produce(plan, staging, name, source.run, source.run_dir)
    out_folder.publish(staging, out)
    return out


def _inputs(source: Any, adapter_only: bool, base: str | None) -> Inputs:
    from trainer.export import merge
    from trainer.export.source import ADAPTER

    if source.kind != ADAPTER or adapter_only:
        return Inputs(_tokenizer(source.folder, source.adapter))
    folder, how = merge.base_folder(source, base)
    recorded = merge.recorded_base_here(source) if base else None
    if recorded is not None and Path(recorded).resolve() == Path(folder).resolve():
        recorded = None
    return Inputs(_tokenizer(source.folder, source.adapter, folder), folder, how, recorded)


def _space_needed(source: Any, inputs: Inputs, adapter_only: bool, dtype: str, plan: Any) -> dict[str, int]:
    """What the export writes, in bytes per part (trainer/export/out_folder.py), for a full disk's message."""
    from trainer.export import merge, out_folder

    weights = out_folder.weights_size(source.adapter if adapter_only else inputs.base or source.folder)
    dtype_name = DTYPE_NAMES.get(dtype) or (merge.run_dtype_name(source) if inputs.base else None)
    per_weight = out_folder.DTYPE_BYTES[dtype_name] if dtype_name else weights[1] / max(weights[0], 1)
    return out_folder.space_needed(weights, per_weight, plan.types if plan is not None else [])


def _tokenizer(*folders: Path | str | None) -> Any:
    """The first folder's tokenizer (of those holding tokenizer_config.json); a vision-language model's processor
    (its image processor, tokenizer and chat template) where a folder saved one; ConfigError naming a folder whose
    tokenizer does not load; None when none holds one."""
    from transformers import AutoTokenizer

    from trainer.export.vision import processor_in

    processor = processor_in(*folders)
    if processor is not None:
        return processor
    for folder in folders:
        if folder and (Path(folder) / "tokenizer_config.json").is_file():
            try:
                return AutoTokenizer.from_pretrained(str(folder))
            except Exception as exc:  # a missing or torn tokenizer file: whatever Transformers says of it
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
                raise ConfigError(f"export: the tokenizer in {folder} does not load ({first}); copy its tokenizer "
                                  "files (tokenizer.json, tokenizer_config.json) again") from None  # fmt: skip
    return None


def _build(source: Any, inputs: Inputs, staging: Path, adapter_only: bool, dtype: str, name: str) -> None:
    from trainer.export import consolidate, merge, model_card, verify
    from trainer.export.source import ADAPTER, FSDP, ZERO
    from trainer.model.adapters import merged
    from trainer.model.expert_adapters import FusedMergeError

    if adapter_only and source.kind != ADAPTER:
        raise ConfigError(f"export --adapter-only: {source.folder} holds no LoRA adapter")
    if adapter_only:
        return _copy_adapter(source, inputs.tokenizer, staging, name)
    tokenizer = inputs.tokenizer
    if source.kind == ADAPTER:
        dtype_name = DTYPE_NAMES.get(dtype) or merge.run_dtype_name(source)
        text_tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor's own fits the base
        reference_model = merge.load_base(str(inputs.base), merge.run_dtype_name(source), source.run, source.adapter,
                                          text_tokenizer)  # fmt: skip
        log.info("export: merging the adapter %s into %s", source.adapter, inputs.base_how)
        try:
            model = merged(reference_model)
        except FusedMergeError as exc:
            raise verify.ExportMismatch(str(exc)) from None
        if inputs.recorded_base:  # the check holds the merge against the run's own base, not --base's
            reference_model = merge.load_base(inputs.recorded_base, merge.run_dtype_name(source), source.run,
                                              source.adapter, text_tokenizer)  # fmt: skip
    elif source.kind in (ZERO, FSDP):
        state = consolidate.zero_state_dict(source.folder) if source.kind == ZERO else consolidate.fsdp_state_dict(
            source.folder)  # fmt: skip
        model = consolidate.model_from_state_dict(source.folder, state)
        reference_model = _unsharded_reference(source.folder) or model
        dtype_name = DTYPE_NAMES.get(dtype) or "float32"
    else:
        reference_model = model = _load_full(source.folder)
        dtype_name = DTYPE_NAMES.get(dtype) or str(model.dtype).removeprefix("torch.")
    bad = first_nonfinite(model.state_dict().items())  # what consolidating or merging made
    if bad:
        raise ConfigError(f"export {source.folder}: the model holds non-finite weights, first in {bad!r}: "
                          f"{DIVERGED_HINT}")  # fmt: skip
    probe = verify.probe_ids(tokenizer, model.config.get_text_config().vocab_size)
    reference = verify.logits(reference_model, probe)
    _save(model, tokenizer, staging, dtype_name)
    (staging / "README.md").write_text(model_card.model_card(source, name, inputs.base_how, source.kind == ADAPTER))
    diff = _verified(staging, reference, probe, dtype_name, inputs)
    log.info("export: %s (%s, %s) loads without peft; logits within %.2g of the reference", name, source.kind,
             dtype_name, diff)  # fmt: skip


def _verified(staging: Path, reference: Any, ids: Any, dtype_name: str, inputs: Inputs) -> float:
    """verify.verify; a merge into --base that computes otherwise than on the run's own base: the user's --base,
    exit 2."""
    from trainer.export import verify

    try:
        return verify.verify(staging, reference, ids, dtype_name)
    except verify.ExportMismatch as exc:
        if not inputs.recorded_base:
            raise
        raise ConfigError(f"export {inputs.base_how}: the adapter merged into it does not compute what it computes on "
                          f"the run's own base {inputs.recorded_base} ({exc}): that is not the base the run trained "
                          "on; drop --base to merge into the recorded one") from None  # fmt: skip


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


def _copy_adapter(source: Any, tokenizer: Any, staging: Path, name: str) -> None:
    from safetensors.torch import load_file

    from trainer.export import adapter_layout, model_card

    for file in ADAPTER_FILES:
        if (source.adapter / file).is_file():
            shutil.copy2(source.adapter / file, staging / file)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(staging))
    (staging / "README.md").write_text(model_card.model_card(source, name, None, False))
    weights = staging / "adapter_model.safetensors"
    if not weights.is_file() or not load_file(str(weights)):
        raise ConfigError(f"export --adapter-only: {source.adapter} holds no adapter_model.safetensors weights")
    adapter_layout.check(staging, source.adapter)
    log.info("export: %s holds the LoRA adapter of %s (--adapter-only), %d tensors", name, source.adapter,
             len(load_file(str(weights))))  # fmt: skip

