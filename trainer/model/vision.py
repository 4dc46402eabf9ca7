"""Vision-language models: their model class and their processor.

A model reads images when its config has a vision tower and generates text (the one rule:
trainer.data.vision.config_reads_images: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Gemma 3, Idefics3, SmolVLM2, LLaVA, ...); it
loads as AutoModelForImageTextToText. Its processor (the image processor, the tokenizer and the chat template) comes
from its folder; where the folder's processor class also builds a video processor that this stack cannot build
(Qwen-VL's and SmolVLM2's need torchvision, which the CPU image lacks), the same class is built without it: trainkit
trains images, not videos, and the folder it saves names the original class, so it loads as usual where torchvision
is installed.
"""

from __future__ import annotations

import inspect
import json
import logging
import types
from pathlib import Path
from typing import Any

from trainer.errors import ConfigError

log = logging.getLogger("trainer")

PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


def is_vision_config(config: Any) -> bool:
    """A loaded config's answer to the one rule (trainer.data.vision.config_reads_images)."""
    from trainer.data.vision import config_reads_images

    return config_reads_images(config.to_dict())


def model_class(config: Any) -> Any:
    """AutoModelForImageTextToText for a vision-language config; None for any other (the caller's own class)."""
    if not is_vision_config(config):
        return None
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText


def video_free(cls: Any) -> Any:
    """`cls` (a processor class) built from its image processor and tokenizer only. ProcessorMixin takes the
    sub-processors from get_attributes (which leaves the video processor out here), and the arguments it saves and
    loads besides them from __init__'s own parameters: so __init__ stays the class's own (SmolVLM's image_seq_len,
    say, is saved and read back), with the video processor defaulting to none. It keeps the class's name: the folder
    it saves names the original class."""
    init = cls.__init__
    names = init.__code__.co_varnames[1 : init.__code__.co_argcount]
    parameters = inspect.signature(init).parameters
    defaults = tuple(None if name == "video_processor" or parameters[name].default is inspect.Parameter.empty
                     else parameters[name].default for name in names[names.index("video_processor") :])  # fmt: skip
    own_init = types.FunctionType(init.__code__, init.__globals__, "__init__", defaults, init.__closure__)
    own_init.__kwdefaults__ = init.__kwdefaults__
    attributes = [name for name in cls.get_attributes() if name != "video_processor"]
    return type(cls.__name__, (cls,), {"__init__": own_init, "__module__": cls.__module__,
                                       "get_attributes": classmethod(lambda _cls: list(attributes))})  # fmt: skip


def _needs_video_processor(cls: Any) -> bool:
    return "video_processor" in inspect.signature(cls.__init__).parameters


def _saved_processor_class(folder: Path) -> str | None:
    for name in (*PROCESSOR_FILES, "tokenizer_config.json"):
        try:
            found = json.loads((folder / name).read_text(encoding="utf-8")).get("processor_class")
        except (OSError, ValueError, AttributeError):
            continue
        if found:
            return str(found)
    return None


def load_processor(folder: str | Path) -> Any:
    """The processor saved in a vision-language model's folder (offline); ConfigError when it has none."""
    import transformers

    folder = Path(folder)
    name = _saved_processor_class(folder)
    cls: Any = getattr(transformers, name, None) if name else None
    if cls is None:
        raise ConfigError(
            f"{folder} holds a vision-language model but no processor Transformers knows (processor_class "
            f"{name!r}); save the model's processor (AutoProcessor.from_pretrained(...).save_pretrained) into it"
        )
    if _needs_video_processor(cls) and not _builds_videos():
        cls = video_free(cls)
    processor = cls.from_pretrained(str(folder), local_files_only=True)
    log.info("processor: %s from %s (image processor %s)", name, folder, type(processor.image_processor).__name__)
    return processor


def _builds_videos() -> bool:
    """Whether this stack builds Transformers' video processors (they need torchvision)."""
    from transformers.utils import is_torchvision_available

    return bool(is_torchvision_available())
