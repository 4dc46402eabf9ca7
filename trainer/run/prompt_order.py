"""Online RL's prompt order across a resume: each epoch's order is the one the uninterrupted run would use.

TRL's GRPO/RLOO trainers order the prompts with RepeatSampler, whose generator is seeded once (TrainingArguments'
seed) and draws one permutation per epoch. A resumed process makes a new sampler, and Transformers' Trainer only skips
the batches already trained in the resumed epoch: it does not replay the epochs before it. So a run resumed after its
first epoch trained epoch N on epoch 1's order (measured: a GRPO run resumed from checkpoint-8, the end of its first
epoch, gave steps 9-16 the prompts of steps 1-8). Transformers' Trainer calls `set_epoch` on the sampler before each
epoch; the subclass below makes that put its generator where the uninterrupted run's is at that epoch (reseeded, the
earlier epochs' permutations drawn again), which an uninterrupted run never needs (its generator is already there),
so its order is TRL's, unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any


@functools.cache  # one subclass per base
def resumable_prompt_order(base: type) -> type:
    """`base` (TRL's GRPOTrainer or RLOOTrainer) whose training sampler follows `set_epoch` (see the module)."""

    class ResumablePromptOrder(base):
        def _get_train_sampler(self, dataset: Any = None) -> Any:
            sampler = super()._get_train_sampler(dataset)
            if getattr(sampler, "shuffle", False) and getattr(sampler, "generator", None) is not None:
                sampler.__class__ = epoch_sampler(type(sampler))
                sampler.first_seed = sampler.generator.initial_seed()
            return sampler

    ResumablePromptOrder.__name__ = ResumablePromptOrder.__qualname__ = f"ResumablePromptOrder{base.__name__}"
    return ResumablePromptOrder


@functools.cache
def epoch_sampler(base: type) -> type:
    """TRL's RepeatSampler (`base`) with `set_epoch(n)`: the next iteration yields epoch n's order (from 0)."""

    class EpochSampler(base):
        epochs_drawn = 0  # permutations drawn from the generator since it was seeded
        first_seed = 0

        def set_epoch(self, epoch: int) -> None:
            if epoch == self.epochs_drawn:
                return
            import torch

            self.generator.manual_seed(self.first_seed)
            for _ in range(epoch):
                torch.randperm(self.num_samples, generator=self.generator)
            self.epochs_drawn = epoch

        def __iter__(self) -> Iterator[int]:
            self.epochs_drawn += 1  # as RepeatSampler draws its permutation, at the iteration's start
            yield from super().__iter__()

    EpochSampler.__name__ = EpochSampler.__qualname__ = f"Epoch{base.__name__}"
    return EpochSampler
