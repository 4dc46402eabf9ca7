"""The memory prediction of a vision-language model (trainer.memory.vision) against tiny-vl built as the run builds
it (trainer.run.training_model.build_vision_model, on image records): the weights, gradients and optimizer state are
the bytes of the real tensors, the tower and projector's included, for every TRAIN_TRAINABLE / LoRA / QLoRA way the
run holds them; what the tower and projector save for the backward pass is within 15 % of the saved tensors measured
(saved-tensor hooks) over the same sequence with and without its picture; the doctor counts them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from test_memory import saved_bytes, tensor_bytes
from vision_data import colour_data

from trainer import config
from trainer.memory.fit import plan_of
from trainer.memory.predict import predict
from trainer.memory.vision import autocast_copy_bytes, image_activations, predict_model

CASES = [  # TRAIN_* besides TRAIN_MODEL=tiny-vl and image records
    {"TRAIN_PRECISION": "fp32"},  # the default parts: projector and language model
    {"TRAIN_PRECISION": "bf16", "TRAIN_TRAINABLE": "vision,projector,language"},
    {"TRAIN_PRECISION": "fp32", "TRAIN_TRAINABLE": "vision,projector", "TRAIN_OPTIM": "adamw_bnb_8bit"},
    {"TRAIN_PRECISION": "bf16", "TRAIN_LORA": "1"},  # adapters on the language model, the projector whole
    {"TRAIN_PRECISION": "bf16", "TRAIN_LORA": "1", "TRAIN_TRAINABLE": "vision,projector,language"},
    {"TRAIN_PRECISION": "bf16", "TRAIN_LORA": "1", "TRAIN_QUANT": "4bit"},
]


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return colour_data(tmp_path_factory.mktemp("vl-memory"), 2)


def resolved(records: Path, env: dict[str, str]) -> config.RunConfig:
    settings = {"TRAIN_MODEL": "tiny-vl", "TRAIN_DATA": str(records), **env}
    return config.resolve(config.parse_settings(settings), environ={})


def built(cfg: config.RunConfig) -> tuple[Any, Any]:
    from trainer.model.vision_preset import qwen2_vl_processor
    from trainer.run.training_model import build_vision_model
    from trainer.tokenizer import byte_level_tokenizer

    processor = qwen2_vl_processor(byte_level_tokenizer(), "tiny-vl")
    return build_vision_model(cfg, processor, frozenset(cfg.decisions.trainable.value)), processor


def picture_batch(processor: Any, records: Path, with_picture: bool) -> dict[str, Any]:
    """A record's question with its picture (56x56: 4 image tokens), or the same ids without pixels (the image
    tokens then read as text): the language model sees the same sequence either way."""
    from PIL import Image

    picture = Image.open(next((records.parent / "images").iterdir())).convert("RGB").resize((56, 56))
    text = "<|vision_start|><|image_pad|><|vision_end|>What colour is this? red"
    batch = dict(processor(text=[text], images=[picture], return_tensors="pt"))
    batch["labels"] = batch["input_ids"].clone()
    if not with_picture:
        pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
        batch = {"input_ids": batch["input_ids"].masked_fill(batch["input_ids"] == pad, 65),
                 "attention_mask": batch["attention_mask"], "labels": batch["labels"]}  # fmt: skip
    return batch


@pytest.mark.parametrize("env", CASES, ids=lambda env: "-".join(env.values()))
def test_weights_gradients_and_optimizer_state_are_the_bytes_of_the_real_tensors(records: Path, env: dict) -> None:
    cfg = resolved(records, env)
    plan = plan_of(cfg)
    assert plan.vision is not None and plan.trainable == tuple(cfg.decisions.trainable.value)
    model, processor = built(cfg)
    real = tensor_bytes(cfg, model, picture_batch(processor, records, with_picture=True),
                        autocast=plan.precision == "bf16")
    parts = predict_model(plan).parts
    assert {name: parts[name] for name in real} == real
    language = predict(plan).parts
    assert parts["weights"] > language["weights"]  # the tower and projector counted
    if "projector" in plan.trainable:
        assert parts["optimizer"] > language["optimizer"]


def measured_saved(model: Any, batch: dict[str, Any], precision: str) -> int:
    """Bytes autograd saves for the backward pass in a forward pass over `batch` (parameters left out)."""
    torch.manual_seed(0)
    return saved_bytes(model, batch, precision)


TRAINED = [("fp32", "vision,projector,language", "0"), ("bf16", "vision,projector,language", "0"),
           ("fp32", "projector,language", "0"), ("bf16", "vision,projector,language", "1")]  # fmt: skip


@pytest.mark.parametrize(("precision", "trainable", "lora"), TRAINED, ids=lambda v: v)
def test_image_activations_are_within_15_percent_of_what_the_tower_and_projector_save(
    records: Path, precision: str, trainable: str, lora: str
) -> None:
    """The same sequence with and without its picture: the difference is what the tower and the projector save
    (with the tower trained, its blocks per patch; the projector's inputs; under bf16 autocast the compute-dtype
    copies of their trained fp32 weights). A frozen tower saves nothing."""
    cfg = resolved(records, {"TRAIN_PRECISION": precision, "TRAIN_TRAINABLE": trainable, "TRAIN_LORA": lora})
    model, processor = built(cfg)
    plan = replace(plan_of(cfg), dropout_mask_bytes=4)  # the CPU's dropout keeps float noise (test_memory.py)
    assert plan.vision is not None
    with_picture = picture_batch(processor, records, with_picture=True)
    image_tokens = int((with_picture["input_ids"] == model.config.image_token_id).sum())
    # with a picture the language model's inputs need a gradient (the projector's output); without, they need one too
    model.get_input_embeddings().register_forward_hook(lambda module, inputs, output: output.requires_grad_(True))
    measured = measured_saved(model, with_picture, precision) - measured_saved(
        model, picture_batch(processor, records, with_picture=False), precision)
    kept = image_activations(plan, plan.vision, image_tokens)[0] + autocast_copy_bytes(plan, plan.vision)
    print(f"tiny-vl {precision} {trainable} lora={lora}: {image_tokens} image tokens, predicted {kept}, "
          f"measured {measured} bytes")
    assert image_tokens == 4 and measured > 0
    assert abs(kept - measured) <= 0.15 * measured, (kept, measured)


def test_doctor_counts_the_tower_and_says_nothing_is_left_out(records: Path) -> None:
    from trainer.doctor.memory import not_counted

    cfg = resolved(records, {})
    assert not_counted(cfg) is None
    plan = plan_of(cfg)
    assert plan.vision is not None and sum(plan.vision.tower) > 0 and sum(plan.vision.projector) > 0
