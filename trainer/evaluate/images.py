"""`eval --data` on records with images: read, checked and masked as training reads them (trainer.data.vision,
vision_encode), the loss on the assistant turns, and the model's greedy answer to each record's last question (its
images up to there) scored against the record's last assistant turn. Every record names the images it used by their
sha256, and the summary counts them."""

from __future__ import annotations

from typing import Any

from trainer.errors import ConfigError


def score_images(loaded: Any, generator: Any, source: Any, spec: Any, pattern: Any, batch_size: int,
                 generate: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:  # fmt: skip
    """(the summary's figures, one record per scored record)."""
    from trainer.data.vision import read_records
    from trainer.data.vision_dataset import ImageCollator, prepare_images
    from trainer.data.vision_encode import ImageEncoder
    from trainer.evaluate.loss import loss_of_batches
    from trainer.evaluate.metrics import perplexity

    if loaded.processor is None:
        raise ConfigError(f"eval --data {source.spec}: it holds records with images but {loaded.plan.described} is a "
                          "text-only model; give a vision-language model")  # fmt: skip
    read = read_records(source, spec.loss_on, spec.max_bad_lines)
    template = loaded.processor.chat_template or loaded.tokenizer.chat_template
    encoder = ImageEncoder(loaded.processor, template, spec.loss_on)
    dataset = prepare_images(read, encoder, spec.seq_len, spec.long_records, spec.max_bad_lines, "eval --data")
    loaded.model.config.use_cache = False
    collate = ImageCollator()
    batches = (collate([dataset[i] for i in range(start, min(start + batch_size, len(dataset)))])
               for start in range(0, len(dataset), batch_size))  # fmt: skip
    loss = loss_of_batches(loaded.model, batches, loaded.device, len(dataset))
    loaded.model.config.use_cache = True
    records = _answers(generator, dataset.records, pattern, batch_size) if generate else []
    hashes = sorted({f.sha256 for r in dataset.records for f in r.facts})
    summary = {"loss": loss.loss, "perplexity": perplexity(loss.loss), "trained_tokens": loss.trained_tokens,
               "sequences": loss.sequences, "images": {"count": sum(len(r.facts) for r in dataset.records),
                                                       "distinct": len(hashes), "sha256": hashes}}  # fmt: skip
    return summary, records


def _question(record: Any) -> tuple[Any, str] | None:
    """(a Prompt of the turns before the last assistant turn, with their images; that turn's text), or None."""
    from trainer.answers.decoding import Prompt

    messages = record.conversation.messages
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if not last:
        return None
    shown = sum(1 for m in messages[:last] for part in m["content"] if part.get("type") == "image")
    reference = "".join(part.get("text", "") for part in messages[last]["content"])
    return Prompt(messages=messages[:last], images=record.images[:shown]), reference


def _answers(generator: Any, records: list[Any], pattern: Any, batch_size: int) -> list[dict[str, Any]]:
    from trainer.evaluate.metrics import scores

    asked = [(record, *found) for record in records if (found := _question(record)) is not None]
    for _, prompt, _ in asked:
        generator.encode(prompt)
    out = []
    for start in range(0, len(asked), batch_size):
        chunk = asked[start : start + batch_size]
        for (record, prompt, reference), answer in zip(chunk, generator.generate([p for _, p, _ in chunk]),
                                                       strict=True):  # fmt: skip
            out.append({"where": record.where, "images": [f.sha256 for f in record.facts[: len(prompt.images)]],
                        "reference": reference, "response": answer.text,
                        **scores(answer.text, reference, pattern), "prompt_tokens": answer.prompt_tokens,
                        "completion_tokens": answer.completion_tokens})  # fmt: skip
    return out
