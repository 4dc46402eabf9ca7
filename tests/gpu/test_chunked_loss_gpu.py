"""TRAIN_CROSS_ENTROPY=chunked on a GPU (issue 58): under bf16 autocast on fp32 weights, as a run computes it, the
chunked loss equals Transformers' loss on the whole logits and its forward-and-backward peak of device memory is
below the full loss's by at least half the logits' own size, at the 1b-128k preset's head (2048 x 128,256) and 8,192
positions. No host-device synchronization when the collator's count is given (CUDA's sync debug mode as "error").
Skipped without a CUDA GPU; the CPU tests are tests/trainer/test_chunked_loss.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from trainer.model.chunked_loss import chunked_causal_lm_loss, trained_count

HAS_CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (none visible to torch)")]
VOCAB, HIDDEN, ROWS, SEQ = 128_256, 2048, 4, 2048


def run(loss_fn: Any, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = (torch.randn(VOCAB, HIDDEN, device="cuda", generator=gen) * 0.02).requires_grad_()
    hidden = torch.randn(ROWS, SEQ, HIDDEN, device="cuda", generator=gen).requires_grad_()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_fn(hidden, weight, labels)
    loss.backward()
    torch.cuda.synchronize()
    return loss.detach(), hidden.grad, weight.grad, torch.cuda.max_memory_allocated() - base


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_chunked_equals_the_full_loss_and_peaks_lower() -> None:
    from transformers.loss.loss_utils import ForCausalLMLoss

    labels = torch.randint(0, VOCAB, (ROWS, SEQ), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    labels[:, :512] = -100  # prompts
    full = run(lambda h, w, y: ForCausalLMLoss(torch.nn.functional.linear(h, w), y, VOCAB), labels)
    chunked = run(lambda h, w, y: chunked_causal_lm_loss(h, w, y), labels)
    assert relative(chunked[0], full[0]) <= 1e-3 and relative(chunked[1], full[1]) <= 1e-2
    assert relative(chunked[2], full[2]) <= 1e-2
    logits_bytes = ROWS * SEQ * VOCAB * 4
    print(f"peak above the inputs: full {full[3] / 2**30:.2f} GiB, chunked {chunked[3] / 2**30:.2f} GiB")
    assert chunked[3] <= full[3] - logits_bytes // 2


def test_no_host_sync_with_the_collators_count() -> None:
    labels = torch.randint(0, VOCAB, (2, 256))
    labels[:, :32] = -100
    count = trained_count(labels)  # on the host, as the collator counts it
    hidden = torch.randn(2, 256, 64, device="cuda", requires_grad=True)
    weight = torch.randn(VOCAB, 64, device="cuda", requires_grad=True)
    labels = labels.cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss = chunked_causal_lm_loss(hidden, weight, labels, trained=count, chunk=128)
        loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(loss).item()
