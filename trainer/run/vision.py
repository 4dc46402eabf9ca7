"""TRAIN_METHOD=sft on records with images (trainer.run.sft hands them here): the model's processor, the refusals
that come before the model loads and need it (a template without images, changed images on resume; the others are
the checks': trainer.config.paths), every record read and encoded, the vision-language model with its trainable
parts, and the atomic Trainer."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.errors import ConfigError
from trainer.run import kit

if TYPE_CHECKING:
    from trainer.config.inputs import Inputs
    from trainer.config.run_config import RunConfig
    from trainer.data.vision import ImageRecords
    from trainer.data.vision_dataset import ImageDataset
    from trainer.data.vision_encode import ImageEncoder

log = logging.getLogger("trainer")

def prepare(setup: kit.Setup) -> kit.Prepared:
    from trainer.data.vision_dataset import ImageCollator
    from trainer.run.checkpoint import AtomicCheckpointTrainer
    from trainer.run.training_model import build_vision_model

    cfg, args = setup.cfg, setup.args
    processor = processor_for(cfg.inputs, setup.tokenizer)
    encoder = encoder_for(cfg.inputs, processor)
    train, held = image_datasets(cfg, encoder, setup.resume.checkpoint is not None)
    model = setup.model(lambda: build_vision_model(cfg, processor, frozenset(cfg.decisions.trainable.value)))
    record = kit.learned(setup.start, args, cfg.decisions, len(train), model)  # the component table, before step 0
    log.info("data: %d records with %d images (%s image tokens per record), one record per sequence",
             len(train), train.read.images(), _spread(train.image_tokens()))  # fmt: skip
    trainer = AtomicCheckpointTrainer(
        model=model, args=args, train_dataset=train, eval_dataset=held, data_collator=ImageCollator(),
        processing_class=processor, callbacks=setup.callbacks(model, record), **kit.optimizer_override(cfg, args),
    )  # fmt: skip
    return kit.Prepared(trainer, record, perplexity=True, processor=processor,
                        data_files=tuple(train.read.image_files()))  # fmt: skip


def _spread(values: list[int]) -> str:
    return f"{min(values)}-{max(values)}" if values and min(values) != max(values) else str(values[0] if values else 0)


def processor_for(inputs: Inputs, tokenizer: Any) -> Any:
    """The processor the records go through: a vision preset's (on the run's byte-level tokenizer) or the model
    folder's (the checks refused a model that reads no images: trainer.config.paths); TRAIN_CHAT_TEMPLATE replaces
    its template."""
    from trainer.config.presets import is_vision_preset
    from trainer.model.vision import load_processor
    from trainer.model.vision_preset import qwen2_vl_processor

    s = inputs.settings
    choice = inputs.template()
    if is_vision_preset(s.model):
        return qwen2_vl_processor(tokenizer, s.model, choice.text if choice.from_setting else None)
    processor = load_processor(inputs.model_folder)
    if choice.from_setting:
        processor.chat_template = processor.tokenizer.chat_template = choice.text
    return processor


def encoder_for(inputs: Inputs, processor: Any) -> ImageEncoder:
    """The records' encoder; ConfigError where the chat template shows no image."""
    from trainer.data.vision_encode import ImageEncoder, template_shows_images

    s = inputs.settings
    template = processor.chat_template or getattr(processor.tokenizer, "chat_template", None)
    origin = inputs.template().origin if inputs.template().text else "the model's processor"
    if not template:
        raise ConfigError(f"TRAIN_MODEL={s.model} has no chat template to render records with images; set "
                          "TRAIN_CHAT_TEMPLATE to one that renders image parts")  # fmt: skip
    encoder = ImageEncoder(processor, template, s.loss_on)
    if not template_shows_images(encoder):
        raise ConfigError(f"the chat template ({origin}) does not render an image part as TRAIN_MODEL={s.model}'s "
                          f"image placeholder {getattr(processor, 'image_token', None)!r}: records with images need "
                          "a template that does; set TRAIN_CHAT_TEMPLATE to the model's own (or leave it unset)")
    return encoder


def training_images(inputs: Inputs, encoder: ImageEncoder) -> ImageDataset:
    """TRAIN_DATA's records, every one read and encoded (the run's and `data --show`'s)."""
    from trainer.data.vision_dataset import prepare_images

    s = inputs.settings
    return prepare_images(_read(inputs.data, s), encoder, s.seq_len, s.long_records, s.data_max_bad_lines)


def image_datasets(cfg: RunConfig, encoder: ImageEncoder, resuming: bool) -> tuple[ImageDataset, Any]:
    """(training records, the eval set: TRAIN_EVAL_DATA's records, TRAIN_EVAL_SPLIT's last records, or None)."""
    from trainer.data.vision_dataset import prepare_images

    s, inputs = cfg.settings, cfg.inputs
    train = training_images(inputs, encoder)
    if resuming:
        refuse_changed_images(train.read, Path(s.output_dir), s.resume_changed_data)
    if s.eval_split > 0:
        held = max(1, round(len(train) * s.eval_split))
        if held >= len(train):
            raise ConfigError(f"TRAIN_EVAL_SPLIT={s.eval_split}: {len(train)} records leave none to train on")
        log.info("eval: %d records with images held out (TRAIN_EVAL_SPLIT=%g)", held, s.eval_split)
        return train.subset(0, len(train) - held), train.subset(len(train) - held, len(train))
    if not s.eval_data:
        return train, None
    read = _read(inputs.eval_data, s)
    return train, prepare_images(read, encoder, s.seq_len, s.long_records, s.data_max_bad_lines, "TRAIN_EVAL_DATA")


def _read(source: Any, s: Any) -> ImageRecords:
    from trainer.data.vision import read_records

    if source.problems:
        raise ConfigError(*source.problems)
    return read_records(source, s.loss_on, s.data_max_bad_lines)


def refuse_changed_images(read: ImageRecords, output_dir: Path, allowed: bool) -> None:
    """A resume on images whose content changed since the run recorded them (provenance.json): ConfigError naming
    them, unless TRAIN_RESUME_CHANGED_DATA=1."""
    from trainer.provenance import read as read_provenance

    before = (read_provenance(output_dir) or {}).get("data") or {}
    now = {str(Path(f.path)): f.sha256 for r in read.records for f in r.facts if f.path}
    changed = [path for path, digest in now.items() if path in before and before[path].get("sha256") != digest]
    if not changed:
        return
    if allowed:
        log.warning("resume: %d image(s) changed since the checkpoint (TRAIN_RESUME_CHANGED_DATA=1): %s", len(changed),
                    ", ".join(changed[:5]))  # fmt: skip
        return
    raise ConfigError(f"{len(changed)} image(s) changed since the run recorded them ({', '.join(changed[:5])}"
                      f"{', ...' if len(changed) > 5 else ''}): the checkpoint in {output_dir} trained on other "
                      "images; restore them, start a new run, or set TRAIN_RESUME_CHANGED_DATA=1 to continue on the "
                      "changed images")  # fmt: skip


def refuse_image_method(inputs: Inputs, rows: list[dict[str, Any]]) -> None:
    """TRAIN_METHOD=dpo/orpo/kto/simpo/reward/grpo/rloo on records with images: refused before the model loads,
    naming the method and the model's family (their data paths carry text: the images would be dropped)."""
    from trainer.config.paths import model_family
    from trainer.data.vision import holds_images
    from trainer.methods import of

    held = sum(1 for row in rows if holds_images(row))
    if not held:
        return
    s = inputs.settings
    method = of(s.method)
    trl, family = method.trl.trainer if method.trl else "trainer", model_family(s.model, inputs.model_folder)
    raise ConfigError(
        f"TRAIN_METHOD={s.method} on records with images ({held} of {len(rows)} records hold images), TRAIN_MODEL="
        f"{s.model} ({family}): refused. TRL's {trl} takes images for some vision-language "
        f"families, but trainkit's {method.family} data path carries text only, so the images would be dropped "
        "without a word; train these records with TRAIN_METHOD=sft, or give records without images"
    )
