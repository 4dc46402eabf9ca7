"""TRAIN_AUTO_BATCH's search: the largest batch whose probed peak memory stays under a limit, in few probes.

Peak memory grows about linearly with the batch (the weights, gradients and optimizer state are fixed; activations
and logits are per sequence). From TRAIN_BATCH_SIZE and twice it (or half, where it does not fit), the line through
the two probes gives the largest batch whose peak stays under the limit: the memory the allocator can hold less
HEADROOM of the device, so that training runs off the allocator's limit (near it, fragmentation and allocation
retries slow each step). That batch is probed to confirm it, and the search stops there; where the confirmation
misses, the line through the two largest probes (or a bisection between the largest size under the limit and the
smallest over it) picks the next. Three probes in the usual case, where halving, doubling and bisecting to the
out-of-memory edge took up to ten (trainer/run/batch_search.py runs the probes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

HEADROOM = 0.10  # of the device's memory, kept free above the probed peak (fragmentation, workspaces, retries)
GIB = 1 << 30


@dataclass(frozen=True)
class Probed:
    """One probe's verdict: whether the batch ran without running out of memory, and its peak bytes (0 where not)."""

    fits: bool
    peak: int = 0


Probe = Callable[[int], Probed]


class DeviceMemory(Protocol):
    """What the search reads of a device's memory (on a GPU, the CUDA allocator's statistics)."""

    name: str
    total: int

    def capacity(self) -> int: ...

    def reset_peak(self) -> None: ...

    def peak(self) -> int: ...


class CudaMemory:
    def __init__(self, device: torch.device) -> None:
        import torch

        props = torch.cuda.get_device_properties(device)
        self.device, self.name, self.total = device, props.name, int(props.total_memory)

    def capacity(self) -> int:
        """Bytes this process's allocator can hold: what it holds now plus what the device has free."""
        import torch

        free, _total = torch.cuda.mem_get_info(self.device)
        return int(free + torch.cuda.memory_reserved(self.device))

    def reset_peak(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> int:
        import torch

        return int(torch.cuda.max_memory_allocated(self.device))


def device_memory(device: torch.device) -> DeviceMemory | None:
    """The memory of `device` as the search reads it; None where there is no out-of-memory to search against."""
    return CudaMemory(device) if device.type == "cuda" else None


def memory_limit(memory: DeviceMemory) -> int:
    """The peak the search lets a batch reach: the allocator's capacity less HEADROOM of the device."""
    return memory.capacity() - int(HEADROOM * memory.total)


@dataclass
class Search:
    """The chosen batch (0: not even 1 fits), every (size, fits, peak bytes) probed in order, and the limit."""

    batch: int = 0
    probes: list[tuple[int, bool, int]] = field(default_factory=list)
    limit: int = 0

    def reason(self, ceiling: int) -> str:
        tried = ", ".join(f"{size} {f'{peak / GIB:.2f} GiB' if ok else 'out of memory'}"
                          for size, ok, peak in self.probes)  # fmt: skip
        bound = " (the ceiling: a larger batch was not tried)" if self.batch == ceiling else ""
        return (
            f"TRAIN_AUTO_BATCH: the largest per-device batch whose peak stays under {self.limit / GIB:.2f} GiB "
            f"(the allocator's capacity less {HEADROOM:.0%} of the device){bound}; probed {tried}"
        )


def line_predicts(peaks: Mapping[int, int], limit: int, slope: int = 0) -> int | None:
    """The largest size whose peak the line through the two largest probed sizes keeps at most `limit`; with one
    size probed, the line through it at `slope` bytes per size (the memory prediction's); None with fewer sizes, or
    a line that does not rise."""
    if len(peaks) == 1 and slope > 0:
        (size,) = peaks
        return size + (limit - peaks[size]) // slope
    if len(peaks) < 2:
        return None
    small, large = sorted(peaks)[-2:]
    per_size = (peaks[large] - peaks[small]) / (large - small)
    if per_size <= 0:
        return None
    return large + int((limit - peaks[large]) // per_size)


def search_predicted(probe: Probe, start: int, ceiling: int, limit: int, slope: int = 0) -> Search:
    """The largest size in 1..ceiling whose probe fits with a peak of at most `limit`, assuming a size under the
    limit means every smaller one is, and that the peak is about linear in the size. A probe at the size the line
    predicts that lands under the limit ends the search (the prediction confirmed); `probe` is called with one size
    at a time, the same sequence wherever it returns the same verdicts. `slope`: the predicted bytes per size (the
    memory prediction's, trainer.memory.predict), which draws the line from the first probe: started at the
    predicted largest size, one probe confirms it, two where the prediction was off."""
    found, peaks = Search(limit=limit), {}
    good, bad = 0, ceiling + 1
    size, predicted = max(1, min(start, ceiling)), False
    while True:
        result = probe(size)
        found.probes.append((size, result.fits, result.peak if result.fits else 0))
        if result.fits:
            peaks[size] = result.peak
        under = result.fits and result.peak <= limit
        good, bad = (size, bad) if under else (good, size)
        if (under and predicted) or bad - good <= 1:
            break
        line = line_predicts(peaks, limit, slope)
        if line is not None and line <= good:
            break  # the line puts the next size over the limit
        predicted = line is not None and (line < bad or bad > ceiling)
        if predicted and line is not None:
            size = min(line, ceiling)
        elif good == 0:
            size = max(1, bad // 2)
        else:
            size = min(good * 2, ceiling) if bad > ceiling else (good + bad) // 2
    found.batch = good
    return found


def agreed(probe: Probe, group: ProcessGroup | None) -> Probe:
    """`probe` as every rank of `group` sees it: fits only where it fit on all of them, the largest peak of them
    (None: this process alone)."""
    if group is None:
        return probe

    def every_rank(size: int) -> Probed:
        import torch
        import torch.distributed as dist

        result = probe(size)
        flags = torch.tensor([1 if result.fits else 0, -result.peak], dtype=torch.int64)
        dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=group)
        fits, negative_peak = (int(v) for v in flags.numpy())
        return Probed(bool(fits), -negative_peak)

    return every_rank


def agreed_limit(limit: int, group: ProcessGroup | None) -> int:
    """The smallest of the ranks' limits (their devices may differ)."""
    if group is None:
        return limit
    import torch
    import torch.distributed as dist

    value = torch.tensor([limit], dtype=torch.int64)
    dist.all_reduce(value, op=dist.ReduceOp.MIN, group=group)
    return int(value.numpy()[0])
