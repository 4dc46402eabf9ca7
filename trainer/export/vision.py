"""Exporting a vision-language model: its processor saved with it, the verification on a prompt with an image, and
the quantized formats refused where their check cannot look at images.

The merged folder must load with Transformers (AutoModelForImageTextToText) with its processor, and compute on a
probe conversation holding an image what the source computes (trainer.export.verify); its reloaded processor must
make the same inputs from that probe. GGUF (llama.cpp) and compressed-tensors exports of these models are refused
before any work, naming the family and the tool: their quality gate scores text, and llama.cpp's image path (the
multimodal projector file and its runtime, mtmd) is not in the pinned build (images/versions.toml's [llama_cpp]
cmake_args: -DLLAVA_BUILD=OFF), so an export that answers images with gibberish could not be caught.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from trainer.errors import ConfigError

PROBE_SIDE = 56  # a 56x56 probe picture: a few image tokens in every family


def processor_in(*folders: Path | str | None) -> Any:
    """The processor of a vision-language model saved in the first of `folders` that holds one; None otherwise."""
    from trainer.data.vision import folder_reads_images
    from trainer.model.vision import PROCESSOR_FILES, load_processor

    for folder in folders:
        if folder and any((Path(folder) / name).is_file() for name in PROCESSOR_FILES):
            return load_processor(folder) if any(f and folder_reads_images(f) for f in folders) else None
    return None


def probe_picture() -> Any:
    """A fixed picture: four coloured quarters (the same pixels on every machine)."""
    from PIL import Image

    image = Image.new("RGB", (PROBE_SIDE, PROBE_SIDE), (200, 40, 40))
    half = PROBE_SIDE // 2
    for box, colour in (((half, 0), (40, 160, 40)), ((0, half), (40, 40, 200)), ((half, half), (220, 210, 40))):
        image.paste(Image.new("RGB", (half, half), colour), box)
    return image


def probe_inputs(processor: Any) -> dict[str, Any]:
    """The processor's tensors for a probe conversation with one image, rendered by the model's chat template."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in the picture?"}]}]
    template = processor.chat_template or processor.tokenizer.chat_template
    text = processor.tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                                   add_generation_prompt=True)  # fmt: skip
    return dict(processor(text=[text], images=[[probe_picture()]], return_tensors="pt"))


def processor_problem(folder: Path, inputs: dict[str, Any]) -> str | None:
    """Why the exported folder's processor does not reload and make the probe's inputs as the source's did; None
    when it does."""
    import torch

    try:
        again = probe_inputs(processor_in(folder))
    except Exception as exc:  # a processor that does not reload is not a usable export
        return f"{folder}: its processor does not reload and render the probe: {exc}"
    changed = [key for key, value in inputs.items() if key not in again or not torch.equal(again[key], value)]
    return f"{folder}: its reloaded processor makes another {changed[0]!r} for the probe image" if changed else None


def vision_model_type(source: Any) -> str | None:
    """The model_type of an export's source when it reads images (its folder, else a LoRA checkpoint's recorded
    base: a folder or a vision preset); None otherwise."""
    from trainer.config.presets import folder_model_type, is_vision_preset, preset_model_type
    from trainer.data.vision import folder_reads_images

    base = source.run.settings.model if source.run is not None else None
    for folder in (source.folder, base):
        if folder and Path(folder).is_dir() and (Path(folder) / "config.json").is_file():
            return folder_model_type(folder) if folder_reads_images(folder) else None
    return preset_model_type(base) if base and is_vision_preset(base) else None


def refuse_quantized(types: list[str], source: Any, converter: Path | None, version: str | None) -> None:
    """ConfigError for `export --quant` of a vision-language model, naming the family and the tool (see above)."""
    kind = vision_model_type(source)
    if kind is None:
        return
    taken = _converter_takes(converter, _architecture(source)) if converter else None
    tool = f"llama.cpp's converter (llama-cpp-python {version})" if version else "the quantized export"
    takes = {True: "registers its architecture (a text model and an --mmproj projector file), but",
             False: "does not register its architecture, and", None: ""}[taken]  # fmt: skip
    raise ConfigError(
        f"export --quant {','.join(types)}: {source.folder} is a vision-language model ({kind}); {tool} {takes} "
        "trainkit refuses it: the quantized export's gate scores text only, and llama.cpp's image runtime (mtmd) is "
        "left out of the pinned build (-DLLAVA_BUILD=OFF in images/versions.toml), so no check would catch an export "
        "that answers images wrongly. Export without --quant (the merged folder is verified on an image prompt)"
    )


def _architecture(source: Any) -> str | None:
    for folder in (source.folder, getattr(source.run.settings, "model", None) if source.run else None):
        if not folder:
            continue
        try:
            found = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8")).get("architectures")
        except (OSError, ValueError, TypeError, AttributeError):
            continue
        if found:
            return str(found[0])
    return None


def _converter_takes(converter: Path, architecture: str | None) -> bool | None:
    """Whether the converter registers this architecture (its conversion/ modules' ModelBase.register names)."""
    if architecture is None:
        return None
    pattern = re.compile(r"ModelBase\.register\(([^)]*)\)")
    names = {name for path in (converter / "conversion").glob("*.py")
             for call in pattern.findall(path.read_text(encoding="utf-8", errors="replace"))
             for name in re.findall(r'"([^"]+)"', call)}  # fmt: skip
    return architecture in names
