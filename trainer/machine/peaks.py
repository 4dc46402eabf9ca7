"""A GPU's peak dense bf16/fp16 FLOP/s by its name: the denominator of mfu in metrics.jsonl."""

from __future__ import annotations

import logging
import re

# Dense (no sparsity) bf16/fp16 tensor-core peak TFLOPS from NVIDIA's datasheets. Order matters:
# the first pattern matching torch.cuda.get_device_name() wins. Unknown GPUs get mfu = null.
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    (r"GH200", 989.0),
    (r"H200.*NVL", 835.0),  # the PCIe card: lower clocks and power than the SXM module
    (r"H200", 989.0),  # SXM
    (r"H100.*PCIe", 756.0),
    (r"H100.*NVL", 835.0),
    (r"H100", 989.0),  # SXM (e.g. "NVIDIA H100 80GB HBM3")
    (r"A100", 312.0),
    (r"A10G", -1.0),  # not the A10; no confirmed figure here
    (r"\bA10\b", 125.0),
    (r"L40S", 362.0),
    (r"\bL4\b", 121.0),
    (r"V100", 125.0),  # fp16
    (r"\bT4\b", 65.0),  # fp16
)


def peak_flops(device_name: str | None) -> float | None:
    """Peak dense bf16/fp16 FLOP/s of a GPU by its name, None when unknown."""
    if not device_name:
        return None
    for pattern, tflops in PEAK_TFLOPS:
        if re.search(pattern, device_name):
            return tflops * 1e12 if tflops > 0 else None
    return None


def this_gpu_peak_flops() -> float | None:
    """Peak FLOP/s of this process's GPU; None on CPU or for a GPU not in PEAK_TFLOPS (then mfu is null)."""
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    peak = peak_flops(name)
    if peak is None:
        logging.getLogger("trainer").info("metrics: no peak FLOPs known for %s, so mfu is null", name)
    return peak
