"""The paths group's home (TRAIN_MODEL, TRAIN_TOKENIZER, TRAIN_DATA, TRAIN_OUTPUT_DIR, TRAIN_SEQ_LEN and what shapes
the data: the chat template, the loss's tokens, packing, long records): their checks, decisions and TrainingArguments.
RoPE scaling's own rules (TRAIN_ROPE_*, a TRAIN_SEQ_LEN beyond the model's positions) are its part
trainer/config/rope.py; the data itself is scanned by the data layer (trainer.data, through `Inputs`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer import compat
from trainer.config.decision import Decision, Decisions, SoFar
from trainer.config.presets import MODEL_PRESETS, VISION_PRESETS, is_preset, is_vision_preset, model_type_of
from trainer.config.rope import readable_model_config, rope_problems
from trainer.data.chat import chat_report, template_problems
from trainer.data.mix import parse_eval_sets, parse_mix
from trainer.data.vision import folder_reads_images, has_images
from trainer.hub.sources import TOKENIZER_FILES, hub_ref
from trainer.methods import names, of

if TYPE_CHECKING:
    from trainer.config.inputs import Inputs
    from trainer.config.schema import TrainSettings
    from trainer.machine.hardware import Hardware


def writable_dir_problem(name: str, path: str) -> str | None:
    """None when `path` is (or can be created as) a writable folder; else why not. Tries a real write: root passes
    every permission check, read-only mounts and files in the way do not."""
    target = Path(path)
    probe_dir = target
    while not probe_dir.exists():
        if probe_dir.parent == probe_dir:
            break
        probe_dir = probe_dir.parent
    if not probe_dir.is_dir():
        return f"{name}={path}: {probe_dir} is a file, not a folder; choose a folder path"
    try:
        with tempfile.NamedTemporaryFile(dir=probe_dir, prefix=".trainkit-write-test-"):
            pass
    except OSError as exc:
        where = "" if probe_dir == target else f" (its nearest existing parent {probe_dir})"
        return (
            f"{name}={path}: the folder{where} is not writable ({exc.strerror}); mount a writable folder there or "
            "run the container with a user that may write it"
        )
    return None


def _readable(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            handle.read(1)
    except OSError:
        return False
    return True


# ---- checks ---------------------------------------------------------------------------------------------------------


def model_problems(s: TrainSettings) -> list[str]:
    """TRAIN_MODEL: a preset (one this stack can build), a Hub ID, or a folder with a readable config.json (doctor
    --memory asks it alone)."""
    if is_preset(s.model):
        refusal = compat.switch_problem(f"TRAIN_MODEL={s.model}")  # tiny-moe on transformers 4
        return [refusal] if refusal else []
    if hub_ref(s.model) is not None:
        return []
    folder = Path(s.model)
    if not folder.exists():
        return [
            f"TRAIN_MODEL={s.model!r} is neither a preset ({', '.join(MODEL_PRESETS)}), an existing folder nor a "
            "Hub ID (org/name[@revision]); mount the model (e.g. -v /path/to/model:/models/name:ro), name it by "
            "Hub ID, or use a preset"
        ]
    if not (folder / "config.json").is_file():
        return [f"TRAIN_MODEL={s.model}: the folder has no config.json; point it at a Hugging Face model folder"]
    if not _readable(folder / "config.json"):
        return [f"TRAIN_MODEL={s.model}: cannot read config.json; check the file's permissions"]
    return []


def _tokenizer_problems(s: TrainSettings) -> list[str]:
    if not s.tokenizer or hub_ref(s.tokenizer) is not None:
        return []
    folder = Path(s.tokenizer)
    if not folder.is_dir():
        return [f"TRAIN_TOKENIZER={s.tokenizer!r} is neither an existing folder nor a Hub ID (org/name[@revision])"]
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return [f"TRAIN_TOKENIZER={s.tokenizer}: the folder has none of {', '.join(TOKENIZER_FILES)}"]
    return []


def _output_problems(s: TrainSettings) -> list[str]:
    problem = writable_dir_problem("TRAIN_OUTPUT_DIR", s.output_dir)
    return [problem] if problem else []


def _data_problems(inputs: Inputs) -> list[str]:
    """The scan's problems (trainer.data.discovery: one scan per run, kept by Inputs); a Hub dataset is scanned after
    it is fetched (Inputs.hub_problems)."""
    if inputs.on_hub("data"):
        return list(inputs.mix.problems)
    return list(inputs.data.problems)


def _mix_problems(s: TrainSettings) -> list[str]:
    """A mix of sources is for SFT and online RL's prompts, several eval sets for SFT (trainer.data.mix);
    preference data is read whole."""
    family = of(s.method).family
    mixes = parse_mix(s.data).is_mix and family != "online"
    lists = [name for name, value in (("TRAIN_DATA", mixes),
                                      ("TRAIN_EVAL_DATA", bool(parse_eval_sets(s.eval_data)))) if value]  # fmt: skip
    if family == "sft" or not lists:
        return []
    return [f"{' and '.join(lists)}: several sources (a mix, named eval sets) are for TRAIN_METHOD=sft (a "
            f"TRAIN_DATA mix also for {'/'.join(names('online'))}); TRAIN_METHOD={s.method} reads one source: give "
            "one path, folder or glob"]  # fmt: skip


def problems(inputs: Inputs) -> list[str]:
    s = inputs.settings
    return [*model_problems(s), *rope_problems(s, readable_model_config(s)), *_tokenizer_problems(s),
            *_output_problems(s), *_data_problems(inputs), *_mix_problems(s)]  # fmt: skip


def problems_after_hub(inputs: Inputs) -> list[str]:
    """TRAIN_CHAT_TEMPLATE that names nothing, conversations with no template anywhere: the template may come with a
    Hub tokenizer; records with images against the model (a Hub model is its snapshot by now)."""
    return [*template_problems(inputs.data, inputs.settings.chat_template, inputs.tokenizer_folder),
            *_image_problems(inputs)]  # fmt: skip


def model_family(model: str, folder: str) -> str:
    """TRAIN_MODEL's family, as messages name it: a preset's model_type, else its folder's config.json's."""
    return model_type_of(model, folder) or "unknown"


def _image_problems(inputs: Inputs) -> list[str]:
    """Records with images (trainer.data.vision) need a model that reads them, one source, and one record per
    sequence."""
    s = inputs.settings
    if not has_images(inputs.data.layouts) or of(s.method).family != "sft":  # the other methods refuse them by name
        return []
    family = model_family(s.model, inputs.model_folder)
    if not (is_vision_preset(s.model) or (not is_preset(s.model) and folder_reads_images(inputs.model_folder))):
        return [f"TRAIN_DATA={s.data} holds records with images ({inputs.data.layout_names()}) but TRAIN_MODEL="
                f"{s.model} is a text-only model ({family}); use a vision-language model (a folder of Qwen2-VL, "
                "Qwen2.5-VL, Qwen3-VL, Gemma 3, Idefics3/SmolVLM, SmolVLM2 or LLaVA, or the "
                f"{', '.join(VISION_PRESETS)} preset), or data without images"]  # fmt: skip
    found = [problem] if (problem := compat.switch_problem(compat.IMAGES)) else []
    if s.packing != "auto":
        found.append(f"TRAIN_PACKING={s.packing} with records with images ({family}): refused. Packing would put "
                     "several records' images, and their multimodal positions, in one sequence, and trainkit has not "
                     "proven for this family that the packed loss and gradients equal the unpacked ones; each record "
                     "is its own sequence (padded to the longest in its batch): leave TRAIN_PACKING=auto")  # fmt: skip
    if inputs.mix.is_mix:
        found.append("TRAIN_DATA: a mix of sources holding records with images is not supported yet; give one source "
                     "(a file, folder or glob)")  # fmt: skip
    return found


# ---- decisions ------------------------------------------------------------------------------------------------------


def _model_decision(inputs: Inputs) -> Decision[str]:
    """The folder (or preset name) the run loads: a Hub ID's value is its snapshot in HF_HOME's cache."""
    s, sources = inputs.settings, inputs.hub
    snap = sources.model
    if snap is None:
        origin = "preset, trained from scratch" if is_preset(s.model) else "local folder, loaded offline"
        return Decision(s.model, origin)
    pinned = sources.pinned.get("model")
    how = f"pinned by {pinned} (resume)" if pinned else f"revision {snap.ref.wanted_revision!r}"
    return Decision(str(snap.path), f"Hub model {snap.ref.repo_id}, {how}: commit {snap.sha}, in the HF_HOME cache")


def _packing_decision(inputs: Inputs) -> Decision[str]:
    """TRAIN_PACKING for the data's record layouts (the packer applies the same rule to each piece: DataSpec)."""
    s = inputs.settings
    method = of(s.method)
    if method.needs_trl:
        return Decision("none", f"TRAIN_METHOD={s.method}: {dict(method.refuses)['packing']}")
    if inputs.mix.is_mix:  # each source is packed on its own (trainer.data.mix)
        parts = zip(inputs.mix.entries, inputs.mix_sources, strict=True)
        each = [(entry.name, inputs.data_spec.packing_of(part.layouts)) for entry, part in parts]
        return Decision(", ".join(f"{name}: {how}" for name, (how, _) in each),
                        "each source packed on its own: " + "; ".join(f"{name}: {why}" for name, (_, why) in each))
    return Decision(*inputs.data_spec.packing_of(inputs.data.layouts))


def decide(inputs: Inputs, hardware: Hardware, so_far: SoFar) -> dict[str, Decision]:
    s, source = inputs.settings, inputs.data
    so_far.problems.extend(source.problems)
    data = source.decision()
    chat = chat_report(source, s.loss_on, s.chat_template, inputs.tokenizer_folder, s.method)
    if has_images(source.layouts) and of(s.method).family == "sft":
        chat = _image_report(inputs)
    return {
        "data": Decision(data.get("value", ""), data.get("reason", "refused")),
        "packing": _packing_decision(inputs),
        "model": _model_decision(inputs),
        **{what: Decision(*found) for what, found in chat.items()},
    }


def _image_report(inputs: Inputs) -> dict[str, tuple[str, str]]:
    """The data format and the chat template of records with images (trainer.data.vision_encode renders them through
    the model's processor, the loss by TRAIN_LOSS_ON, never on an image)."""
    from trainer.data.chat import LOSS_ON_MEANING

    s = inputs.settings
    trained = f"loss on {LOSS_ON_MEANING[s.loss_on]} (TRAIN_LOSS_ON={s.loss_on}), never on an image's tokens"
    if s.chat_template:
        template = inputs.template().origin
    elif is_vision_preset(s.model):
        template = f"the {s.model} preset's own (built-in qwen2-vl)"
    else:
        template = "the model's processor's own"
    use = "renders the records with their image placeholders; saved with the processor in final/ and checkpoints"
    return {"data_format": (inputs.data.layout_names(), trained), "chat_template": (template, use)}


def arguments(settings: TrainSettings, decisions: Decisions, hardware: Hardware) -> dict[str, Any]:
    # the collators read columns the model's forward does not name
    return {"output_dir": settings.output_dir, "remove_unused_columns": False}
