"""TRAIN_CROSS_ENTROPY=chunked: the causal LM loss computed from the last hidden states and the LM head's weight in
chunks of positions, so the whole logits ([positions, vocabulary], the upcast copy twice that) are never held.

At a 128,256-row vocabulary the logits of one micro-batch outweigh the model's other activations and decide the
batch. Here the forward takes each chunk's logits, keeps only their log-sum-exp and the target's logit, and drops
them; the backward computes each chunk's logits again (one more LM-head matmul per step) for its gradients. Only
the trained positions (shifted labels != -100: prompts, padding and record starts are left out, exactly the
positions Transformers' loss counts) go through the head. Labels are shifted as Transformers' ForCausalLMLoss
shifts them (each row padded with -100), so packed records stay apart exactly as with the full loss, and the
reduction is Transformers' (the sum over num_items_in_batch when the Trainer gives it, else the mean).

The decision (trainer.config.speed.decide_cross_entropy) chooses it; trainer.run.training_model installs it on the
model's forward (install_chunked_loss), where Liger would patch it. The loss stays eager under torch.compile (the
decoder layers are compiled; a whole-model compile breaks its graph at the loss)."""

from __future__ import annotations

import logging
import types
from typing import TYPE_CHECKING, Any

import torch

from trainer.config.speed import CHUNK_POSITIONS, CHUNKED_MODEL_TYPES

if TYPE_CHECKING:
    from torch.autograd.function import FunctionCtx
    from transformers import PreTrainedModel
    from transformers.modeling_outputs import CausalLMOutputWithPast

log = logging.getLogger("trainer")

IGNORE_INDEX = -100
# The collator's count of the positions a batch trains (a host int, so selecting them needs no host-device sync);
# the forward takes it out of its keyword arguments before the decoder sees them.
TRAINED_KEY = "trained_positions"


def _compute_dtype(device: torch.device, fallback: torch.dtype) -> torch.dtype:
    """The dtype the LM head's matmul runs in: autocast's, where it is on for this device type, else the weight's."""
    kind = device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return fallback


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    logits = hidden @ weight.t()
    return logits if logits.dtype == torch.float64 else logits.float()  # Transformers upcasts the logits to fp32


class ChunkedCrossEntropy(torch.autograd.Function):
    """sum over rows of cross_entropy(hidden[i] @ weight.T, targets[i]); every row is a trained one. The logits are
    made one chunk at a time in the forward and again in the backward; only log-sum-exp (one float per row) is kept."""

    @staticmethod
    def forward(ctx: FunctionCtx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                chunk: int) -> torch.Tensor:  # fmt: skip
        dtype = _compute_dtype(hidden.device, weight.dtype)
        h, w = hidden.to(dtype), weight.to(dtype)
        wide = torch.promote_types(dtype, torch.float32)
        lse = torch.empty(h.shape[0], dtype=wide, device=h.device)
        total = torch.zeros((), dtype=wide, device=h.device)
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, h.shape[0], chunk):
                logits = _chunk_logits(h[start : start + chunk], w)
                part = torch.logsumexp(logits, dim=-1)
                lse[start : start + chunk] = part
                target = logits.gather(1, targets[start : start + chunk, None]).squeeze(1)
                total = total + (part - target).sum()
        ctx.save_for_backward(h, w, targets, lse)
        ctx.chunk, ctx.dtypes = chunk, (hidden.dtype, weight.dtype)
        ctx.needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        return total

    @staticmethod
    def backward(ctx: FunctionCtx, grad_total: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        h, w, targets, lse = ctx.saved_tensors
        want_hidden, want_weight = ctx.needs
        grad_h = torch.empty_like(h) if want_hidden else None
        wide = torch.promote_types(w.dtype, torch.float32)  # the head's gradient summed over chunks in fp32
        grad_w = torch.zeros(w.shape, dtype=wide, device=w.device) if want_weight else None
        with torch.autocast(h.device.type, enabled=False):
            for start in range(0, h.shape[0], ctx.chunk):
                part = h[start : start + ctx.chunk]
                # d loss / d logits = softmax - one_hot(target), times the incoming gradient
                grad = torch.exp(_chunk_logits(part, w) - lse[start : start + ctx.chunk, None])
                rows = torch.arange(grad.shape[0], device=grad.device)
                grad[rows, targets[start : start + ctx.chunk]] -= 1.0
                grad = (grad * grad_total).to(w.dtype)
                if grad_h is not None:
                    grad_h[start : start + ctx.chunk] = grad @ w
                if grad_w is not None:
                    grad_w += grad.t() @ part
        hidden_dtype, weight_dtype = ctx.dtypes
        return (
            grad_h.to(hidden_dtype) if grad_h is not None else None,
            grad_w.to(weight_dtype) if grad_w is not None else None,
            None,
            None,
        )


def shifted_labels(labels: torch.Tensor, shift_labels: torch.Tensor | None = None) -> torch.Tensor:
    """The label each position predicts, flattened: Transformers' shift (each row padded with -100 at its end)."""
    if shift_labels is None:
        shift_labels = torch.nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
    return shift_labels.reshape(-1)


def trained_count(labels: torch.Tensor) -> int:
    """The trained positions of a batch's labels (host tensors: the collator's count, no device involved)."""
    return int((shifted_labels(labels) != IGNORE_INDEX).sum())


@torch._dynamo.disable  # eager under any compile scope: its chunk loop follows the batch's trained count
def chunked_causal_lm_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    num_items_in_batch: torch.Tensor | int | None = None,
    shift_labels: torch.Tensor | None = None,
    trained: int | None = None,
    chunk: int = CHUNK_POSITIONS,
) -> torch.Tensor:
    """Transformers' causal LM loss (ForCausalLMLoss) of `hidden` [..., positions, hidden] through the head `weight`
    [vocab, hidden], without its whole logits. `trained`: how many positions the labels train, known on the host
    (the collator's count); without it they are found on the device (a host-device sync on a GPU)."""
    targets = shifted_labels(labels, shift_labels).to(hidden.device)
    keep = targets != IGNORE_INDEX
    if trained is None:
        index = keep.nonzero().squeeze(1)
    else:  # trained positions first, in order (a stable sort), and as many as the host counted
        index = torch.argsort((~keep).to(torch.int8), stable=True)[:trained]
    flat = hidden.reshape(-1, hidden.shape[-1])
    total = ChunkedCrossEntropy.apply(flat.index_select(0, index), weight, targets.index_select(0, index), chunk)
    if num_items_in_batch is None:
        return total / keep.sum()  # the mean over trained positions (NaN for none, as Transformers' loss)
    if isinstance(num_items_in_batch, torch.Tensor):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def head_problem(model: PreTrainedModel) -> str | None:
    """Why the chunked loss cannot stand in for this model's loss (None when it can)."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in CHUNKED_MODEL_TYPES:
        known = ", ".join(sorted(CHUNKED_MODEL_TYPES))
        return f"model type {model_type!r} is not one whose head the chunked loss knows ({known})"
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return f"its LM head is a {type(head).__name__}, not a plain bias-free Linear (an adapter or a float8 layer)"
    return None


def install_chunked_loss(model: torch.nn.Module, chunk: int = CHUNK_POSITIONS) -> PreTrainedModel:
    """Replace the forward of the causal LM under any PEFT wrapper: with labels, its loss is the chunked one and it
    returns no logits (the Trainer asks only the loss: prediction_loss_only); without labels, the model's own
    forward. Returns the model whose forward was replaced."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    problem = head_problem(base)
    if problem:
        raise ValueError(f"TRAIN_CROSS_ENTROPY=chunked: {problem}")
    original = type(base).forward

    def forward(self: Any, *args: Any, labels: torch.Tensor | None = None, **kwargs: Any) -> Any:
        trained = kwargs.pop(TRAINED_KEY, None)
        if labels is None or args:
            return original(self, *args, labels=labels, **kwargs)
        return _chunked_forward(self, labels, trained, chunk, kwargs)

    base.forward = types.MethodType(forward, base)
    log.info("loss: chunked cross-entropy (%d positions a chunk, trained positions only; the logits are never "
             "held whole)", chunk)  # fmt: skip
    return base


def _chunked_forward(model: PreTrainedModel, labels: torch.Tensor, trained: int | None, chunk: int,
                     kwargs: dict[str, Any]) -> CausalLMOutputWithPast:  # fmt: skip
    from transformers.modeling_outputs import CausalLMOutputWithPast

    num_items = kwargs.pop("num_items_in_batch", None)
    shift = kwargs.pop("shift_labels", None)
    kwargs.pop("logits_to_keep", None)
    outputs = model.get_decoder()(**kwargs)
    loss = chunked_causal_lm_loss(outputs.last_hidden_state, model.get_output_embeddings().weight, labels,
                                  num_items, shift, trained, chunk)  # fmt: skip
    return CausalLMOutputWithPast(loss=loss, logits=None, past_key_values=outputs.past_key_values,
                                  hidden_states=outputs.hidden_states, attentions=outputs.attentions)  # fmt: skip
