"""What each process holds under DeepSpeed ZeRO (the layout of deepspeed 0.19's runtime/zero/stage_1_and_2.py and
stage3.py), for trainer/memory/predict.py: from the parameter groups the optimizer gets (tensor sizes in the
model's order), per rank, in elements. Checked equal to the bytes of the real partitions of two DeepSpeed
processes of the tiny preset (tests/trainer/test_memory_zero.py).

- ZeRO-1 and 2: each group is flattened into one buffer, padded to a multiple of 2 x the processes (4-byte
  alignment of 16-bit values), and every rank keeps all of it (the weights); rank r owns the r-th of the equal
  partitions: its fp32 master copy and optimizer state. At the step a rank holds the gradients of every whole
  tensor that overlaps its partition (a tensor across a boundary is held whole on both sides), ZeRO-1 as ZeRO-2.
- ZeRO-3: every tensor is split on its own into equal partitions, padded to a multiple of the processes; tensors
  of at most the persistence threshold (Transformers' "auto": 10 x hidden) are also kept whole on every rank. A
  rank's gradients, master copy and optimizer state are its partitions of the trainable tensors. The optimizer
  gets one group per sub-group of at most `sub_group_size` elements (the generated config's 1e9).
"""

from __future__ import annotations

from dataclasses import dataclass

NCCL_ALIGNMENT = 2  # ZeRO-1/2: nccl_start_alignment_factor, times the processes
PERSISTENCE_PER_HIDDEN = 10  # Transformers' "auto" stage3_param_persistence_threshold: 10 x hidden_size
SUB_GROUP = 10**9  # trainer/config/deepspeed.py's sub_group_size


@dataclass(frozen=True)
class Held:
    """One rank's elements: weights and gradients in the model's dtype, its fp32 master partition (the optimizer's
    states are shaped like it) and how many optimizer groups (a step count each) it steps."""

    weights: int
    gradients: int
    master: int
    groups: int


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def overlapping(sizes: list[int], start: int, end: int) -> int:
    """Elements of the whole tensors of `sizes` (laid end to end) that overlap [start, end), plus the padding past
    the last tensor that falls in it."""
    held = offset = 0
    for size in sizes:
        if offset < end and offset + size > start:
            held += size
        offset += size
    return held + max(0, end - max(start, offset))


def stage_1_2(groups: list[list[int]], frozen: list[int], processes: int) -> list[Held]:
    """Per rank under ZeRO-1 or 2: `groups`, the trainable tensors' sizes per optimizer group; `frozen`, the
    sizes of tensors the optimizer does not get (kept whole on every rank)."""
    n = max(processes, 1)
    ranks = []
    for rank in range(n):
        weights, gradients, master = sum(frozen), 0, 0
        for sizes in groups:
            padded = _ceil(sum(sizes), NCCL_ALIGNMENT * n) * NCCL_ALIGNMENT * n
            part = padded // n
            weights += padded
            master += part
            gradients += overlapping(sizes, rank * part, (rank + 1) * part)
        ranks.append(Held(weights, gradients, master, len(groups)))
    return ranks


def stage_3(groups: list[list[int]], frozen: list[int], processes: int, hidden: int) -> list[Held]:
    """Per rank under ZeRO-3 (every rank holds the same amounts: each tensor is split evenly)."""
    n = max(processes, 1)
    threshold = PERSISTENCE_PER_HIDDEN * hidden
    every = [size for sizes in groups for size in sizes] + frozen
    weights = sum(_ceil(size, n) for size in every) + sum(size for size in every if size <= threshold)
    parts = [sum(_ceil(size, n) for size in sizes) for sizes in groups]
    sub_groups = sum(_ceil(part, SUB_GROUP) for part in parts if part)
    return [Held(weights, sum(parts), sum(parts), sub_groups)] * n
