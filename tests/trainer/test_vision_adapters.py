"""tiny-vl built as the run builds it (trainer.run.training_model.build_vision_model), a step on a picture, in-process:
LoRA trains only its adapters and the projector's copy, the frozen tower gets no gradient (checkpointed or not);
gradient checkpointing gives the loss and gradients of the plain run; QLoRA (bitsandbytes' CPU backend) leaves the
projector unquantized, quantizes the tower and trains the same parts."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from test_memory_vision import built, picture_batch, resolved
from vision_data import colour_data

from trainer.model.vision_parts import part_of


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return colour_data(tmp_path_factory.mktemp("vl-adapters"), 2)


def checkpointed(model: Any) -> Any:
    """Gradient checkpointing as the Trainer turns it on (TrainingArguments' gradient_checkpointing_kwargs)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def tower_output_needs_grad(model: Any, batch: dict[str, Any]) -> bool:
    """Whether the tower's last block's output asks for a gradient (the backward pass then runs through the tower)."""
    tower = next(module for name, module in model.named_modules() if name.endswith("visual"))
    seen: list[bool] = []
    handle = tower.blocks[-1].register_forward_hook(lambda module, inputs, output: seen.append(output.requires_grad))
    model.train()
    model(**batch).loss.backward()
    handle.remove()
    model.zero_grad(set_to_none=True)
    return seen[-1]


def step(model: Any, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
    """One AdamW step over the trainable parameters; the parameters after it, by name."""
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model(**batch).loss.backward()
    optimizer.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def changed_parts(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> set[str]:
    return {name for name in before if not torch.equal(before[name], after[name])}


@pytest.mark.parametrize("quant", ["none", "4bit"], ids=["lora", "qlora"])
def test_lora_with_images_trains_only_the_adapters_and_the_projector_copy(records: Path, quant: str) -> None:
    if quant == "4bit":
        pytest.importorskip("bitsandbytes", reason="QLoRA needs bitsandbytes")
    cfg = resolved(records, {"TRAIN_LORA": "1", "TRAIN_QUANT": quant, "TRAIN_GRAD_CKPT": "1"})
    assert cfg.decisions.trainable.value == ["projector", "language"]
    model, processor = built(cfg)
    batch = picture_batch(processor, records, with_picture=True)
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in name or "modules_to_save" in name for name in trained), trained
    assert {part_of(name) for name in trained if "modules_to_save" in name} == {"projector"}
    assert not any("lora_" in name and part_of(name) == "vision" for name in trained)
    if quant == "4bit":  # the projector trains whole: bitsandbytes leaves it as it is, the tower's linears 4-bit
        import bitsandbytes as bnb

        linears = {name: module for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
        assert not any(isinstance(m, bnb.nn.Linear4bit) for n, m in linears.items() if part_of(n) == "projector")
        assert any(isinstance(m, bnb.nn.Linear4bit) for n, m in linears.items() if part_of(n) == "vision")
    checkpointed(model)
    assert not tower_output_needs_grad(model, batch)  # enable_input_require_grads' hook kept off the frozen tower
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    changed = changed_parts(before, step(model, batch))
    assert changed == trained, changed ^ trained
    assert not any(part_of(name) == "vision" for name in changed)


def gradients(model: Any, batch: dict[str, Any]) -> tuple[float, dict[str, torch.Tensor]]:
    model.train()
    torch.manual_seed(0)  # the same LoRA dropout masks in both runs
    loss = model(**batch).loss
    loss.backward()
    found = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return float(loss), found


@pytest.mark.parametrize("env", [{"TRAIN_TRAINABLE": "vision,projector,language"}, {"TRAIN_LORA": "1"}],
                         ids=["whole", "lora"])  # fmt: skip
def test_gradient_checkpointing_with_images_gives_the_plain_loss_and_gradients(records: Path, env: dict) -> None:
    """fp32, so that the recomputed blocks give the saved values: the loss and every gradient, the tower's included
    where it trains, equal within float32's rounding."""
    cfg = resolved(records, {"TRAIN_PRECISION": "fp32", **env})
    model, processor = built(cfg)
    batch = picture_batch(processor, records, with_picture=True)
    plain_loss, plain = gradients(model, batch)
    checkpointed_loss, recomputed = gradients(checkpointed(copy.deepcopy(model)), batch)
    assert plain and plain.keys() == recomputed.keys()
    if "TRAIN_TRAINABLE" in env:
        assert any(part_of(name) == "vision" for name in plain)
    assert checkpointed_loss == pytest.approx(plain_loss, rel=1e-6)
    for name, grad in plain.items():
        torch.testing.assert_close(recomputed[name], grad, rtol=1e-4, atol=1e-6, msg=name)
