"""Router health of a mixture-of-experts run, per logging step: each layer's token share per expert, the experts
that got no tokens, the load-balancing loss, and a warning when a layer collapses onto a few experts.

A hook on each router (trainer.model.moe.routers) adds the experts it chose per position to a [layers, experts]
count on the device (index_add_: no host read, no collective outside logging steps); only the training forwards
count, once each: inside the model's own forward (not the backward's recomputation of checkpointed layers), with
gradients on (not a DPO reference's or a generation's forward) and in training mode. Padding positions are left out
where the batch carries a 2D attention mask (preference and online RL); packed SFT batches count every position.
The model's own load-balancing loss (Transformers' `aux_loss`, the Switch Transformer loss summed over layers) is
averaged over the forwards since the last line; the model adds it to the loss times the family's coefficient
(`router_aux_loss_coef`) where the family defines one: for SFT the hook below asks for it (TRL's DPO and GRPO ask
themselves).

metrics.jsonl holds the whole share matrix (`router/expert_share`: one list per MoE layer); the log line's scalars
(router/aux_loss, router/unused_experts, router/collapsed_layers, and per layer router/layer_N/max_share and
router/layer_N/unused) also go to the trackers: a 48-layer, 128-expert model would give each tracker 6,144 series
per line, so they get the per-layer summaries and metrics.jsonl the matrix.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
from transformers import TrainerCallback

from trainer.config.moe import Moe
from trainer.model.moe import routers

if TYPE_CHECKING:
    from transformers import TrainerState

log = logging.getLogger("trainer")

COLLAPSE_SHARE = 0.9  # a layer whose top-k busiest experts take this share of its tokens has collapsed onto them
PREFIX = "router/"
SHARES_KEY = "router/expert_share"


class RouterMetrics(TrainerCallback):
    """Counts the routers' choices on the device; `log_fields` turns them into a log line's fields."""

    def __init__(self, model: torch.nn.Module, moe: Moe, coefficient: float | None = None, why: str = "") -> None:
        """`coefficient`: the load-balancing loss's (trainer.config.moe's decision; None: the family's own)."""
        self.moe = moe
        self.base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.coefficient = moe.aux_coef if coefficient is None else coefficient
        if hasattr(self.base, "router_aux_loss_coef"):
            self.base.router_aux_loss_coef = self.coefficient  # what the model's forward adds to the loss (SFT)
        self.layers = [name for name, _ in routers(self.base)]
        self.counts: torch.Tensor | None = None  # [layers, experts] on the routers' device, made by the first count
        self.aux_sum: torch.Tensor | None = None
        self.forwards = 0
        self.shares: list[list[float]] | None = None  # the last line's matrix, for metrics.jsonl
        self.collapsed: set[int] = set()
        self._depth = 0
        self._mask: torch.Tensor | None = None
        self._install()
        added = (f"added with coefficient {self.coefficient:g}" if self.coefficient else "not added") + (
            f" ({why})" if why else "")  # fmt: skip
        log.info("router: %d MoE layers, %s; %s", len(self.layers), moe.describe(),
                 f"load-balancing loss logged as router/aux_loss, {added}" if moe.aux_coef
                 else f"no load-balancing loss ({moe.model_type} defines none)")  # fmt: skip

    def _install(self) -> None:
        self.base.register_forward_pre_hook(self._enter, with_kwargs=True)
        self.base.register_forward_hook(self._leave, always_call=True)
        for layer, (_, module) in enumerate(routers(self.base)):
            module.register_forward_hook(self._counter(layer))

    def _training(self, module: torch.nn.Module) -> bool:
        return module.training and torch.is_grad_enabled()

    def _enter(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not self._training(module):
            return None
        self._depth += 1
        mask = kwargs.get("attention_mask")
        self._mask = mask.reshape(-1).to(torch.float32) if mask is not None and mask.dim() == 2 else None
        if self.moe.aux_coef:  # the family computes the loss: asked for, the model adds it x its coefficient
            kwargs["output_router_logits"] = True
        return args, kwargs

    def _leave(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if not self._training(module) or self._depth == 0:
            return
        self._depth -= 1
        aux = getattr(output, "aux_loss", None)
        if isinstance(aux, torch.Tensor):
            self.aux_sum = aux.detach().float() + (self.aux_sum if self.aux_sum is not None else 0.0)
            self.forwards += 1

    def _counter(self, layer: int) -> Any:
        def hook(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if self._depth == 0 or not self._training(module):
                return
            chosen = output[2] if isinstance(output, tuple) else output.topk(self.moe.top_k, dim=-1).indices
            if self.counts is None:
                self.counts = torch.zeros(len(self.layers), self.moe.experts, device=chosen.device)
            weight = torch.ones(chosen.numel(), device=chosen.device)
            if self._mask is not None and self._mask.numel() == chosen.shape[0]:
                weight = self._mask.to(chosen.device).repeat_interleave(chosen.shape[-1])
            self.counts[layer].index_add_(0, chosen.reshape(-1), weight)

        return hook

    def log_fields(self, state: TrainerState) -> dict[str, float]:
        """The fields of a logging step's line (trackers and metrics.jsonl), from the counts since the last line
        (summed over ranks); counting starts over."""
        if self.counts is None:
            return {}
        counts = _summed(self.counts.clone())
        self.counts.zero_()  # in place: a compiled layer's hook keeps writing into the same tensor
        forwards = torch.tensor(float(self.forwards), device=self.counts.device)
        aux = _summed(self.aux_sum) / _summed(forwards).clamp(min=1) if self.aux_sum is not None else None
        self.aux_sum, self.forwards = None, 0
        if not counts.any():
            return {}
        shares = (counts / counts.sum(-1, keepdim=True).clamp(min=1)).tolist()
        self.shares = [[round(x, 6) for x in row] for row in shares]
        fields: dict[str, float] = {}
        if aux is not None:
            fields[PREFIX + "aux_loss"] = float(aux)
        unused = [sum(1 for x in row if x == 0) for row in shares]
        collapsed = {i for i, row in enumerate(shares) if _collapsed(row, self.moe)}
        fields[PREFIX + "unused_experts"] = sum(unused)
        fields[PREFIX + "collapsed_layers"] = len(collapsed)
        for i, row in enumerate(shares):
            fields[f"{PREFIX}layer_{i}/max_share"] = max(row)
            fields[f"{PREFIX}layer_{i}/unused"] = unused[i]
        self._warn(collapsed, shares, state.global_step)
        return fields

    def _warn(self, collapsed: set[int], shares: list[list[float]], step: int) -> None:
        new = sorted(collapsed - self.collapsed)
        if new:
            k = self.moe.top_k
            said = "; ".join(f"layer {i} ({self.layers[i]}): {sum(sorted(shares[i])[-k:]):.0%} of its tokens to "
                             f"experts {sorted(range(len(shares[i])), key=lambda e: -shares[i][e])[:k]}"
                             for i in new)  # fmt: skip
            log.warning("router collapse at step %d: %s (a balanced router gives its top-%d experts %.0f%%); "
                        "router/expert_share in metrics.jsonl has every expert's share", step, said, k,
                        100 * self.moe.active_share)  # fmt: skip
        for i in sorted(self.collapsed - collapsed):
            log.info("router: layer %d no longer collapsed at step %d", i, step)
        self.collapsed = collapsed


def _collapsed(row: list[float], moe: Moe) -> bool:
    return moe.active_share < COLLAPSE_SHARE <= sum(sorted(row)[-moe.top_k:])


def _summed(t: torch.Tensor) -> torch.Tensor:
    """`t` summed over the ranks (on its device: NCCL's are the GPUs), on a logging step only (every rank logs it)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        t = t.clone()
        dist.all_reduce(t)
    return t.float().cpu()

