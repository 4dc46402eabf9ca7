"""Online RL across a resume: the resumed run trains on what the uninterrupted run would have.

Two pieces of TRL's GRPO/RLOO trainers live outside what Transformers' Trainer checkpoints and restores:

- The prompt order. RepeatSampler's generator is seeded once (TrainingArguments' seed) and draws one permutation per
  epoch. A resumed process makes a new sampler, and Transformers' Trainer only skips the batches already trained in
  the resumed epoch; it does not replay the epochs before it. So a run resumed after its first epoch trained epoch N
  on epoch 1's order (measured: a GRPO run resumed from checkpoint-8, the end of its first epoch, gave steps 9-16 the
  prompts of steps 1-8). The Trainer calls `set_epoch` on the sampler before each epoch; here that puts the generator
  where the uninterrupted run's is at that epoch (reseeded, the earlier epochs' permutations drawn again). An
  uninterrupted run's generator is already there, so its order is TRL's, unchanged.
- The generation buffer. With `steps_per_generation` (or `num_iterations`) above one optimizer step, one generation
  serves several steps: TRL keeps it in `_buffered_inputs` and counts micro-steps in `_step`, both lost on a restart,
  so a run resumed inside such a block would generate anew at another point and shift every later block. A
  checkpoint inside a block keeps the block's unused part, the count and the block's completions as TRL logs them
  (samples.jsonl's rows; GENERATION_BUFFER, beside Transformers' rng_state.pth), and the resumed run takes them back
  with the random state.
"""

from __future__ import annotations

import functools
import os
from collections import deque
from collections.abc import Iterator
from typing import Any

GENERATION_BUFFER = "rl_generation_buffer.pt"


@functools.cache  # one subclass per base
def resumable_online(base: type) -> type:
    """`base` (TRL's GRPOTrainer or RLOOTrainer) with the prompt order and the generation buffer kept across a
    resume (see the module)."""

    class ResumableOnline(base):
        def _get_train_sampler(self, dataset: Any = None) -> Any:
            sampler = super()._get_train_sampler(dataset)
            if getattr(sampler, "shuffle", False) and getattr(sampler, "generator", None) is not None:
                kind: type = type(sampler)
                sampler.__class__ = epoch_sampler(kind)
                sampler.first_seed = sampler.generator.initial_seed()
            return sampler

        def _buffer_file(self, folder: str) -> str:
            name = GENERATION_BUFFER
            if self.args.world_size > 1:  # each process its own part of the generation, as rng_state_N.pth
                name = name.replace(".pt", f"_{self.args.process_index}.pt")
            return os.path.join(folder, name)

        def _save_rng_state(self, output_dir: str) -> None:
            super()._save_rng_state(output_dir)
            every = self.args.steps_per_generation * self.num_iterations
            if getattr(self, "_buffered_inputs", None) is not None and self._step % every:
                import torch

                logs = {key: list(value) if isinstance(value, deque) else {k: list(v) for k, v in value.items()}
                        for key, value in getattr(self, "_logs", {}).items()}  # fmt: skip
                torch.save({"step": self._step, "buffered_inputs": self._buffered_inputs, "logs": logs,
                            "layout": self._layout()}, self._buffer_file(output_dir))  # fmt: skip

        def _layout(self) -> list[int]:
            """What the buffer's slicing depends on: a resume on another process count or accumulation (trainkit's
            reshard) generates anew on every process alike instead of taking a part cut for another layout."""
            return [self.args.world_size, self.args.gradient_accumulation_steps, self.args.steps_per_generation]

        def _load_rng_state(self, checkpoint: str | None) -> None:
            super()._load_rng_state(checkpoint)
            if checkpoint is None:
                return
            path = self._buffer_file(checkpoint)
            kept = None
            if os.path.isfile(path):
                import torch

                kept = torch.load(path, weights_only=True)
            if kept is not None and kept.get("layout") == self._layout():
                self._step, self._buffered_inputs = kept["step"], kept["buffered_inputs"]
                for key, value in kept["logs"].items():  # the block's completions, for samples.jsonl
                    shown = self._logs[key]
                    for target, items in ([(shown, value)] if isinstance(value, list) else
                                          [(shown[k], v) for k, v in value.items()]):  # fmt: skip
                        target.clear()
                        target.extend(items)
            else:  # the checkpoint ends a block (or another layout): the next step generates, counted from the step
                self._step = self.state.global_step * self.args.gradient_accumulation_steps

    ResumableOnline.__name__ = ResumableOnline.__qualname__ = f"Resumable{base.__name__}"
    return ResumableOnline


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
