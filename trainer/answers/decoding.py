"""Prompts in, answers out: rendering (the model's chat template, or plain text), the decoding settings (the saved
generation config, then the command line; greedy unless sampling is asked for), and batched generation with left
padding, each answer cut where the model ends its turn."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

from trainer.config.rope import context_length
from trainer.errors import ConfigError

DEFAULT_MAX_NEW_TOKENS = 256
PROBE = "\x00trainkit-probe\x00"


@dataclass(frozen=True)
class Sampling:
    """--temperature, --top-p, --max-new-tokens, --seed (None: the saved generation config's, else greedy)."""

    temperature: float | None = None
    top_p: float | None = None
    max_new_tokens: int | None = None
    seed: int | None = None


@dataclass
class Answer:
    text: str
    prompt_tokens: int
    completion_tokens: int


@dataclass
class Prompt:
    """One request: `messages` through the chat template, or `text` completed as it is."""

    text: str | None = None
    messages: list[dict[str, Any]] | None = None
    ids: list[int] = field(default_factory=list)
    images: list[Any] = field(default_factory=list)  # trainer.data.images.ImageRef, in the messages' image order


class Generator:
    """Generation for one loaded model (trainer.generate.loading.Loaded)."""

    def __init__(self, loaded: Any, sampling: Sampling) -> None:
        self.loaded, self.model, self.tokenizer = loaded, loaded.model, loaded.tokenizer
        self.processor: Any = getattr(loaded, "processor", None)  # a vision-language model's: prompts with images
        self.template = loaded.chat_template
        self.config = generation_config(self.model, self.tokenizer, sampling)
        self.stop = end_of_turn(self.tokenizer, self.template) if self.template else None
        self.context = context_length(self.model.config.to_dict()) or 0
        self.generated_tokens, self.seconds = 0, 0.0
        if sampling.seed is not None:
            from transformers import set_seed

            set_seed(sampling.seed)

    def describe(self) -> str:
        c = self.config
        how = f"sampling (temperature {c.temperature}, top-p {c.top_p})" if c.do_sample else "greedy"
        template = "the model's chat template" if self.template else "plain completion (the model has no chat template)"
        return f"decoding: {how}, at most {c.max_new_tokens} new tokens; prompts: {template}"

    def encode(self, prompt: Prompt) -> Prompt:
        """The prompt's token ids; ConfigError when it needs a template the model lacks, or leaves no room."""
        if prompt.messages is not None:
            if not self.template:
                raise ConfigError("messages need a chat template and this model has none: give `prompt` text, or "
                                  "--chat-template NAME|FILE")  # fmt: skip
            text = self.tokenizer.apply_chat_template(prompt.messages, tokenize=False, add_generation_prompt=True)
            prompt.ids = self._ids_with_images(text, prompt) if prompt.images else self.tokenizer(
                text, add_special_tokens=False)["input_ids"]  # fmt: skip
        else:
            prompt.ids = self.tokenizer(prompt.text or "", add_special_tokens=True)["input_ids"]
        if self.context and len(prompt.ids) + self.config.max_new_tokens > self.context:
            raise ConfigError(f"the prompt is {len(prompt.ids)} tokens; with --max-new-tokens "
                              f"{self.config.max_new_tokens} it exceeds the model's context of {self.context} tokens: "
                              "shorten it or lower --max-new-tokens")  # fmt: skip
        return prompt

    def _ids_with_images(self, text: str, prompt: Prompt) -> list[int]:
        """The prompt's ids with its images expanded by the processor; ConfigError for a text-only model."""
        if self.processor is None:
            raise ConfigError(f"the prompt has {len(prompt.images)} image(s) but {self.loaded.plan.described} is a "
                              "text-only model: give a vision-language model, or prompts without images")  # fmt: skip
        prompt.text = text
        return [int(i) for i in self._processed([prompt])["input_ids"][0]]

    def _processed(self, prompts: list[Prompt]) -> Any:
        """The processor's tensors for rendered prompts with images (left padded), on the model's device."""
        from trainer.data.images import read_image

        images = [[read_image(ref)[0] for ref in p.images] for p in prompts]
        out = self.processor(text=[p.text for p in prompts], images=images if any(images) else None, padding=True,
                             padding_side="left", return_tensors="pt")  # fmt: skip
        return out.to(self.loaded.device)

    def generate(self, prompts: list[Prompt]) -> list[Answer]:
        """Answers to encoded prompts, generated together (left padding: every row's next token is at the end)."""
        import torch

        pad = self.config.pad_token_id
        width = max(len(p.ids) for p in prompts)
        if any(p.images for p in prompts):  # the processor pads and adds the pixels (the ids are its own)
            inputs = dict(self._processed(prompts))
        else:
            ids = torch.tensor([[pad] * (width - len(p.ids)) + p.ids for p in prompts], device=self.loaded.device)
            mask = torch.tensor([[0] * (width - len(p.ids)) + [1] * len(p.ids) for p in prompts],
                                device=self.loaded.device)  # fmt: skip
            inputs = {"input_ids": ids, "attention_mask": mask}
        width = inputs["input_ids"].shape[1]
        extra = {"stop_strings": [self.stop], "tokenizer": self.tokenizer} if self.stop else {}
        start = time.perf_counter()
        with torch.no_grad():
            out = self.model.generate(**inputs, generation_config=self.config, **extra)
        self.seconds += time.perf_counter() - start
        answers = [self._answer(row[width:].tolist(), len(p.ids)) for row, p in zip(out, prompts, strict=True)]
        self.generated_tokens += sum(a.completion_tokens for a in answers)
        return answers

    def _answer(self, new: list[int], prompt_tokens: int) -> Answer:
        """The generated tokens up to the first EOS (kept) or padding (a row that ended earlier), decoded and cut at
        the end-of-turn text."""
        eos, pad = set(_ids(self.config.eos_token_id)), self.config.pad_token_id
        count = len(new)
        for i, token in enumerate(new):
            if token in eos or token == pad:
                count = i + 1 if token in eos else i
                break
        text = self.tokenizer.decode(new[:count], skip_special_tokens=True)
        if self.stop and self.stop in text:
            text = text[: text.index(self.stop)]
        return Answer(text, prompt_tokens, count)


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list | tuple) else [int(value)]


def generation_config(model: Any, tokenizer: Any, sampling: Sampling) -> Any:
    """The model's saved generation config with the command line's choices on top; greedy unless it or the
    command line samples."""
    config = copy.deepcopy(model.generation_config)
    if sampling.temperature is not None:
        config.do_sample = sampling.temperature > 0
        if config.do_sample:
            config.temperature = sampling.temperature
    if sampling.top_p is not None:
        config.top_p = sampling.top_p
        config.do_sample = config.do_sample or sampling.temperature is None
    if not config.do_sample:  # greedy: sampling knobs would only draw warnings
        config.temperature, config.top_p, config.top_k = None, None, None
    config.max_new_tokens = sampling.max_new_tokens or getattr(config, "max_new_tokens", None) or DEFAULT_MAX_NEW_TOKENS
    config.max_length = None
    if config.eos_token_id is None:
        config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else _ids(config.eos_token_id)[0]
    config.use_cache = True  # a trained model's config may say False (training needs no cache)
    return config


def end_of_turn(tokenizer: Any, template: str) -> str | None:
    """The text the chat template puts after an assistant message (e.g. `<|im_end|>`): where an answer ends."""
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": PROBE}], chat_template=template,
            tokenize=False,
        )  # fmt: skip
    except Exception:  # a template that refuses this probe conversation: stop at EOS only
        return None
    after = text.split(PROBE, 1)[1].strip() if PROBE in text else ""
    return after or None
