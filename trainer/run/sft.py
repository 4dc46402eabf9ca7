"""TRAIN_METHOD=sft on Transformers' Trainer made atomic (trainer.run.checkpoint): the packed dataset (a mix drawn
by its shares), the model, TRAIN_AUTO_BATCH's search, the eval set."""

from __future__ import annotations

from trainer.data.vision import has_images
from trainer.run import kit


def prepare(setup: kit.Setup) -> kit.Prepared | None:
    """The packed dataset, the model and the atomic Trainer of an SFT run, and the run's record with what it learned
    before its first step; None when a stop came while preparing."""
    from trainer.data.cache import Stopped
    from trainer.model.packed_attention import collator_for
    from trainer.run.checkpoint import AtomicCheckpointTrainer
    from trainer.run.disk_space import full_disk_ends_run
    from trainer.run.evaluation import training_data
    from trainer.run.training_model import build_model

    cfg, args, tokenizer, inputs = setup.cfg, setup.args, setup.tokenizer, setup.cfg.inputs
    if has_images(inputs.data.layouts):
        from trainer.run import vision

        return vision.prepare(setup)  # records with images: the vision-language path
    try:  # local rank 0 prepares the data; the other ranks wait for its cache (trainer.data.cache)
        with full_disk_ends_run(inputs.cache_dir, "writing the tokenized data cache"):
            dataset, eval_dataset = training_data(inputs, tokenizer, should_stop=lambda: setup.stop.requested)
    except Stopped:
        return None
    model = setup.model(lambda: build_model(cfg, tokenizer))
    decisions = cfg.decisions
    if decisions.auto_batch.value:
        from trainer.run.batch_search import apply_auto_batch

        decisions = apply_auto_batch(cfg, args, model, len(dataset), setup.resume.checkpoint)
    record = kit.learned(setup.start, args, decisions, len(dataset), model, getattr(dataset, "report", None))
    trainer = AtomicCheckpointTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        eval_dataset=eval_dataset,
        data_collator=collator_for(cfg.decisions.attn.value, cfg.decisions.cross_entropy.value == "chunked"),
        processing_class=tokenizer,
        callbacks=setup.callbacks(model, record),
        **kit.optimizer_override(cfg, args),
    )
    return kit.Prepared(trainer, record, perplexity=True)
