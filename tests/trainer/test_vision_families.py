"""Each vision-language family trainkit trains (tests/trainer/vision_families.py: tiny random models of Qwen2-VL,
Qwen2.5-VL, Qwen3-VL, Gemma 3, Idefics3/SmolVLM, SmolVLM2 and LLaVA), in-process: the loss only on the assistant
turns, never on an image; on every batch as many image tokens as the vision tower makes features (a record cut after
its image included); the parameters by component and the default freeze; a freeze that LoRA would break is refused;
the saved processor reloads (without its video processor where torchvision is absent) and encodes as built."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from vision_data import QUESTION, colour_row, picture
from vision_families import FAMILIES, build

from trainer.data.vision import ImageRecords, record_of
from trainer.data.vision_dataset import ImageCollator, prepare_images
from trainer.data.vision_encode import ImageEncoder, LongRecord, fit_to_length
from trainer.errors import ConfigError
from trainer.model.components import count
from trainer.model.vision_parts import check_frozen, outermost_modules, part_of, set_trainable

DEFAULT_PARTS = frozenset({"projector", "language"})  # TRAIN_TRAINABLE's default


@pytest.fixture(scope="module")
def pictures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("pictures")
    for i, (colour, size) in enumerate((("red", (56, 42)), ("blue", (28, 28)), ("green", (70, 56)))):
        picture(folder / f"{i}.png", colour, size, seed=i)
    return folder


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> tuple[str, Any, Any]:
    model, processor = build(request.param)
    return request.param, model, processor


def _two_turns(folder: Path) -> Any:
    """A system turn, a question with a picture and its answer, then a text question and its answer."""
    row = colour_row("0.png", "red")
    row["messages"] += [{"role": "user", "content": [{"type": "text", "text": "And twice?"}]},
                        {"role": "assistant", "content": [{"type": "text", "text": "red red"}]}]  # fmt: skip
    return record_of(row, "image_messages", "two-turns:1", folder)


def test_loss_only_on_the_assistant_turns(family: tuple[str, Any, Any], pictures: Path) -> None:
    name, _, processor = family
    encoder = ImageEncoder(processor, processor.chat_template, "assistant")
    encoded = encoder.encode(_two_turns(pictures))
    trained = encoded.ids[encoded.trained.astype(bool)]
    text = encoder.tokenizer.decode(trained, skip_special_tokens=True)
    assert text.replace("\n", "").replace(" ", "").replace("</s>", "") == "redredred", (name, text)
    first_answer = encoder.tokenizer.decode(encoded.ids[: int(encoded.trained.argmax())])
    assert QUESTION in first_answer and "red" not in first_answer.split(QUESTION)[-1].replace("\n", ""), name
    (start, end), = encoded.image_spans
    assert end > start and not encoded.trained[start:end].any(), name
    image_token = processor.image_token_id if hasattr(processor, "image_token_id") else None
    assert image_token is None or not encoded.trained[encoded.ids == image_token].any(), name


def test_the_saved_processor_reloads_and_encodes_as_built(family: tuple[str, Any, Any], pictures: Path,
                                                          tmp_path: Path) -> None:  # fmt: skip
    """load_processor of the saved folder: the original class named there and loaded (built without its video
    processor where that needs torchvision), with the processor's own settings (SmolVLM2's image_seq_len), so a
    record encodes to the same tokens and image spans."""
    import json

    import transformers

    from trainer.model.vision import load_processor

    name, _, processor = family
    processor.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "processor_config.json").read_text())["processor_class"]
    assert saved == type(processor).__name__ and issubclass(type(processor), getattr(transformers, saved)), name
    loaded = load_processor(tmp_path)
    assert type(loaded).__name__ == saved, name
    record = _two_turns(pictures)
    built, again = (ImageEncoder(p, p.chat_template, "assistant").encode(record) for p in (processor, loaded))
    assert built.ids.tolist() == again.ids.tolist() and built.image_spans == again.image_spans, name


def _features(model: Any, batch: dict[str, Any]) -> int:
    """Image features the vision tower and projector make for a batch: rows of the projector's output."""
    name = next(n for n in outermost_modules(model, "projector") if not n.endswith("deepstack_merger_list"))
    made: list[int] = []
    hook = model.get_submodule(name).register_forward_hook(
        lambda _m, _i, out: made.append(out.numel() // model.config.get_text_config().hidden_size))
    try:
        loss = model(**batch).loss
    finally:
        hook.remove()
    loss.backward()
    assert torch.isfinite(loss)
    return sum(made)


def test_image_tokens_equal_the_features_on_every_batch(family: tuple[str, Any, Any], pictures: Path) -> None:
    """Records of several sizes, one too long cut after its image (TRAIN_LONG_RECORDS=truncate) and one that would
    be cut through its image refused: every batch holds as many image tokens as the tower makes features."""
    name, model, processor = family
    encoder = ImageEncoder(processor, processor.chat_template, "assistant")
    long_answer = colour_row("2.png", "green")
    long_answer["messages"][1]["content"][0]["text"] = "green " * 40
    rows = [colour_row("0.png", "red"), colour_row("1.png", "blue"), long_answer, colour_row("2.png", "green")]
    records = [record_of(r, "image_messages", f"x:{i}", pictures) for i, r in enumerate(rows, 1)]
    seq_len = max(len(encoder.encode(r).ids) for r in records[:2]) + 8
    dataset = prepare_images(ImageRecords(records, [], ()), encoder, seq_len, "truncate", 0)
    assert len(dataset) == 4 and dataset.encoded[2].kept == seq_len < len(dataset.encoded[2].ids), name
    config = model.config  # the token the model replaces with features (Gemma 3's soft token, not its <start_of_image>)
    image_id = config.image_token_id if hasattr(config, "image_token_id") else config.image_token_index
    collate = ImageCollator()
    for start in (0, 2):
        batch = collate([dataset[i] for i in (start, start + 1)])
        assert batch["input_ids"].shape[1] <= seq_len
        assert int((batch["input_ids"] == image_id).sum()) == _features(model, batch), name
    with pytest.raises(LongRecord, match="through an image"):
        fit_to_length(encoder.encode(records[0]), dataset.encoded[0].image_spans[0][0] + 1, "truncate", "x:1")


def test_components_and_the_default_freeze(family: tuple[str, Any, Any]) -> None:
    name, model, _ = family
    set_trainable(model, DEFAULT_PARTS)
    rows = {r.component: r for r in count(model)}
    assert set(rows) == {"vision tower", "projector", "language model", "total"}, (name, rows)
    assert rows["vision tower"].trainable == 0 and rows["vision tower"].parameters > 0, name
    assert rows["projector"].trainable == rows["projector"].parameters > 0, name
    assert rows["language model"].trainable == rows["language model"].parameters > 0, name
    assert rows["total"].parameters == sum(p.numel() for p in model.parameters()), name
    check_frozen(model, DEFAULT_PARTS, "the trainable parts")
    set_trainable(model, frozenset({"vision", "projector", "language"}))


def test_a_freeze_lora_would_break_is_refused(family: tuple[str, Any, Any]) -> None:
    """LoRA on q_proj,v_proj, names the language model and some vision towers share: where it reaches a frozen
    tower, the run stops naming it; the default targets (the language model's linears) keep the tower frozen."""
    import copy

    from trainer.model.adapters import apply_lora
    from trainer.model.vision_parts import linear_modules

    name, model, _ = family
    settings = SimpleNamespace(quant="none", grad_ckpt=False, lora_targets="q_proj,v_proj", lora_r=4, lora_alpha=8,
                               lora_dropout=0.0)  # fmt: skip
    fresh = copy.deepcopy(model)
    set_trainable(fresh, DEFAULT_PARTS)
    adapted = apply_lora(fresh, settings)
    reaches_tower = any("lora_" in n and part_of(n) == "vision" for n, _ in adapted.named_parameters())
    if reaches_tower:
        with pytest.raises(ConfigError, match=r"the vision tower is to stay frozen but .* would train"):
            check_frozen(adapted, DEFAULT_PARTS, "the trainable parts")
    else:
        assert name.startswith("qwen"), name  # Qwen-VL towers name their attention qkv/proj
    fresh = copy.deepcopy(model)
    set_trainable(fresh, DEFAULT_PARTS)
    default = SimpleNamespace(**{**vars(settings), "lora_targets": "all-linear"})
    adapted = apply_lora(fresh, default, targets=linear_modules(fresh, frozenset({"language"})),
                         whole=outermost_modules(fresh, "projector"))  # fmt: skip
    check_frozen(adapted, DEFAULT_PARTS, "the trainable parts")
    rows = {r.component: r for r in count(adapted)}
    assert rows["vision tower"].trainable == 0 and rows["projector"].trainable > 0
    assert rows["language model"].trainable > 0


def test_quantized_exports_refused_naming_family_and_converter(family: tuple[str, Any, Any], tmp_path: Path) -> None:
    """GGUF of a vision-language model: refused before any work, naming the family, the converter's version and
    whether it takes the family (it reads the pinned converter's registry where it is installed)."""
    from trainer.export.gguf import tools
    from trainer.export.source import resolve_source
    from trainer.export.vision import refuse_quantized

    name, model, processor = family
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    try:
        found = tools(["q8_0"])
        converter, version = found.converter, found.version
    except ConfigError:  # llama.cpp is not installed here: the refusal still names the family
        converter, version = None, None
    with pytest.raises(ConfigError, match=rf"vision-language model \({name}\)") as refused:
        refuse_quantized(["q8_0"], resolve_source(tmp_path), converter, version)
    if version:
        assert f"llama-cpp-python {version}" in refused.value.message
        assert "registers its architecture" in refused.value.message, refused.value.message  # all six, in 0.3.36


def test_the_memory_prediction_counts_the_tower_and_projector_the_model_has(family: tuple[str, Any, Any]) -> None:
    """trainer.memory.vision_shape from the family's config.json (Transformers' diff form: the defaults left out):
    every tensor of the tower and the projector, as built."""
    import json

    from trainer.memory.vision_shape import config_vision

    name, model, _ = family
    shape = config_vision(json.loads(model.config.to_json_string(use_diff=True)))
    assert shape is not None and shape.family == name
    built = {part: sorted(p.numel() for n, p in model.named_parameters() if part_of(n) == part)
             for part in ("vision", "projector")}  # fmt: skip
    assert (sorted(shape.tower), sorted(shape.projector)) == (built["vision"], built["projector"]), name
    linears = sorted((m.in_features, m.out_features) for n, m in model.named_modules()
                     if isinstance(m, torch.nn.Linear) and part_of(n) == "vision")  # fmt: skip
    assert sorted(shape.tower_linears) == linears, name
