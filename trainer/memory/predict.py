"""Will it fit? The predicted peak GPU memory of a run, part by part, from its resolved configuration: torch-free and
before any model is built or loaded, so a 1b run is planned on a laptop (`python -m trainer doctor --memory`) and a
GPU run predicted not to fit exits 2 before it loads the model (trainer/memory/fit.py).

Where each part comes from (`SOURCES`, shown beside each figure):
- weights, gradients, optimizer state: the parameter count of the model's shape (a preset's, or a model folder's
  config.json) times the bytes per value the run holds them in (fp32 master weights for full fine-tuning, the
  compute dtype for a frozen LoRA base, bitsandbytes' 4-bit and 8-bit layouts, AdamW's two fp32 states, 8-bit
  AdamW's blockwise layout), sharded by ZeRO/FSDP across the processes, moved off the GPU by offload. Tested equal
  to the bytes of the real tensors of the built model and optimizer (tests/trainer/test_memory.py); under ZeRO,
  DeepSpeed's own layout per rank (trainer/memory/zero.py), tested equal to the real partitions of two
  DeepSpeed processes (tests/trainer/test_memory_zero.py).
- activations: what autograd saves for the backward pass, per token and per layer, in the layout of the Llama
  decoder as Transformers runs it (with PEFT's adapters for LoRA and QLoRA): counted from the tensors saved-tensor
  hooks see on the real model on the CPU (fp32 and bf16 autocast), within 15% of a measurement at two batch sizes
  and two lengths (the test).
- logits and loss: the vocabulary-wide tensors of the loss (logits, their fp32 copy, log-softmax, its gradient).
- method extras: DPO's reference model and its pairs, GRPO's generation KV cache.
- framework: the CUDA context, cuBLAS workspaces and allocator fragmentation: an allowance, not measured (no GPU
  here); the allocator's peak (`peak_mem_bytes`) leaves it out, so `allocated_bytes` is what it is compared with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from trainer.config.precision import compute_dtype_bytes
from trainer.memory.shape import EXPERTS, LINEARS, Shape
from trainer.memory.vision_shape import VisionShape
from trainer.memory.zero import Held, stage_1_2, stage_3
from trainer.methods import of

MIB = 1 << 20
CONTEXT_BYTES = 512 * MIB  # CUDA context and cuBLAS/cuDNN workspaces: an allowance, not measured here
FRAGMENTATION = 0.05  # of the allocated peak, for the caching allocator's rounding and fragmentation: an allowance
BNB_BLOCK, BNB_MIN_8BIT = 256, 4096  # bitsandbytes' 8-bit optimizers: blockwise absmax, small tensors kept fp32
NF4_BLOCK, NF4_NESTED = 64, 256  # bitsandbytes 4-bit: absmax per 64 weights, double-quantized in blocks of 256

SOURCES = {
    "weights": "parameter count x bytes held (config shape; tested on the built model)",
    "gradients": "trainable parameters x their dtype, DeepSpeed's partitions or FSDP's shards (tested on real ones)",
    "optimizer": "the optimizer's state layout per trainable parameter (tested on the real optimizer's state)",
    "activations": "tensors autograd saves per token and layer, counted on the real model with saved-tensor hooks",
    "autocast_copies": "autocast's compute-dtype copies of fp32 linear weights, saved for the backward pass",
    "logits_and_loss": "tokens x vocabulary: logits, their fp32 copy, log-softmax and its gradient",
    "method_extras": "reference model / pairs (preference methods), generation KV cache (online RL, transformers)",
    "vllm_colocated": "TRAIN_RL_VLLM_MEMORY x the device's memory: vLLM's engine in the training process (TRL's "
                      "colocate mode: its copy of the weights, activations and KV cache)",
    "framework": "CUDA context, workspaces, allocator fragmentation: an allowance, unmeasured",
}


@dataclass(frozen=True)
class Plan:
    """Every memory-relevant decision of a run (from its RunConfig: `plan_of`), one micro-batch of `batch` x
    `seq_len` tokens per process."""

    shape: Shape
    batch: int
    seq_len: int
    precision: str = "bf16"  # fp32, bf16, fp16, fp8 (trainer/config/precision.py)
    grad_accum: int = 1
    lora: bool = False
    lora_r: int = 16
    lora_targets: tuple[str, ...] = LINEARS
    lora_dropout: float = 0.05
    dropout_mask_bytes: int = 1  # per element: CUDA's fused dropout keeps a bool mask; the CPU's keeps float noise (4)
    quant: str = "none"
    optim: str = "adamw_torch_fused"
    zero_stage: int = 0
    zero_offload: str = "none"
    fsdp: str = "none"
    processes: int = 1
    grad_ckpt: bool = False
    attn: str = "sdpa"
    record_mask: bool = False  # packed records kept apart by a mask (trainer.model.packed_attention): SDPA repeats k, v
    method: str = "sft"
    reference: str = "none"
    rl_new_tokens: int = 0
    rl_engine: str = "transformers"  # online RL's generation: transformers (its KV cache here) or vllm (elsewhere)
    vllm_bytes: int = 0  # vLLM colocated: its share of the device (TRAIN_RL_VLLM_MEMORY x the device's memory)
    loss_chunk_tokens: int = 0  # TRAIN_CROSS_ENTROPY=chunked: positions per chunk of logits (0: all at once)
    moe_impl: str = "grouped_mm"  # a mixture's experts implementation (trainer.config.moe)
    vision: VisionShape | None = None  # a vision-language model's tower and projector (trainer.memory.vision)
    trainable: tuple[str, ...] = ("language",)  # TRAIN_TRAINABLE's parts (vision, projector, language)
    notes: tuple[str, ...] = field(default=())

    @property
    def compute_bytes(self) -> int:
        return compute_dtype_bytes(self.precision)


@dataclass(frozen=True)
class Prediction:
    """The predicted peak of one process, its parts (bytes, in `SOURCES`' order) and the plan it was made for."""

    plan: Plan
    parts: dict[str, int]

    @property
    def peak(self) -> int:
        return sum(self.parts.values())

    @property
    def allocated(self) -> int:
        """What the allocator's peak (peak_mem_bytes, torch.cuda.max_memory_allocated) is compared with."""
        return self.peak - self.parts["framework"]


def adapter_params(plan: Plan) -> tuple[int, int]:
    """(parameters, tensors) of the LoRA adapters: A (r x in) and B (out x r) per targeted linear of every layer; on
    the routed experts one pair per fused tensor, E experts' worth (A [E x r, in], B [out, E x r])."""
    sizes = tensor_sizes(plan)
    return sum(sizes), len(sizes)


def trainable(plan: Plan) -> tuple[int, int]:
    """(trainable parameters, their tensors)."""
    return adapter_params(plan) if plan.lora else (plan.shape.total(), plan.shape.tensors())


def shards(plan: Plan, what: str) -> int:
    """How many processes share `what` (weights, gradients, optimizer) under ZeRO or FSDP."""
    n = max(plan.processes, 1)
    if plan.fsdp in ("full_shard", "hybrid_shard"):
        return n
    if plan.fsdp == "shard_grad_op":
        return 1 if what == "weights" else n
    stage_needed = {"optimizer": 1, "gradients": 2, "weights": 3}[what]
    return n if plan.zero_stage >= stage_needed else 1


def quantized_linear_bytes(plan: Plan) -> int:
    """bitsandbytes' weights of the decoder's linears: 4-bit NF4 with double-quantized absmax, or int8 with an fp32
    scale per output row. The embeddings, norms and LM head stay in the compute dtype."""
    linears = plan.shape.quantizable()
    n = sum(a * b for a, b in linears)
    if plan.quant == "4bit":  # per tensor: uint8 absmax per block, an fp32 absmax per block of those
        blocks = [math.ceil(a * b / NF4_BLOCK) for a, b in linears]
        return n // 2 + sum(blocks) + sum(math.ceil(b / NF4_NESTED) * 4 for b in blocks)
    return n + sum(out for _, out in linears) * 4


def optimizer_groups(plan: Plan) -> tuple[list[list[int]], list[int]]:
    """The trainable tensors' sizes in the model's order, as Transformers' optimizer groups (with weight decay; then
    without: the norms), and the frozen tensors' sizes."""
    s = plan.shape
    layers = [size for layer in range(s.layers) for size in s.layer_tensors(layer)]
    decay = [s.embedding()] + layers + ([] if s.tied else [s.embedding()])
    norms = s.layer_norms() * s.layers + [s.hidden]
    return ([tensor_sizes(plan)], decay + norms) if plan.lora else ([decay, norms], [])


def zero_ranks(plan: Plan) -> list[Held] | None:
    """What each process holds under DeepSpeed ZeRO (elements; trainer/memory/zero.py), None without it."""
    if not plan.zero_stage or plan.fsdp != "none":
        return None
    groups, frozen = optimizer_groups(plan)
    if plan.zero_stage == 3:
        return stage_3(groups, frozen, plan.processes, plan.shape.hidden)
    return stage_1_2(groups, frozen, plan.processes)


def weights_bytes(plan: Plan) -> int:
    s, c = plan.shape, plan.compute_bytes
    ranks = zero_ranks(plan)
    if ranks and plan.quant == "none":  # DeepSpeed holds the model in the compute dtype, flat or partitioned
        return max(h.weights for h in ranks) * c
    if plan.quant != "none":  # under LoRA, PEFT's prepare_model_for_kbit_training makes the rest fp32
        other = s.total() - sum(a * b for a, b in s.quantizable())
        base = quantized_linear_bytes(plan) + other * (4 if plan.lora else c)
    elif plan.lora:  # a frozen base, read in the compute dtype (fp32 under FSDP: one flat dtype with the adapters)
        base = s.total() * (4 if plan.fsdp != "none" else c)
    else:  # fp32 master weights, autocast computes in the compute dtype
        base = s.total() * 4
    adapters = adapter_params(plan)[0] * 4 if plan.lora else 0
    return (base + adapters) // shards(plan, "weights")


def gradient_bytes(plan: Plan) -> int:
    """ZeRO-1's backward holds every whole gradient until its reduction at the end (measured: most of them at once);
    ZeRO-2/3 hold only what their partition needs (trainer/memory/zero.py)."""
    params, _ = trainable(plan)
    ranks = zero_ranks(plan)
    if ranks and plan.zero_stage >= 2:
        return max(h.gradients for h in ranks) * plan.compute_bytes
    width = plan.compute_bytes if plan.zero_stage else 4
    return params * width // shards(plan, "gradients")


def bnb_8bit_state(numel: int) -> int:
    """bitsandbytes' 8-bit Adam state of one tensor: two uint8 states and two fp32 absmax per 256-value block, or
    two fp32 states under 4096 values (its min_8bit_size)."""
    if numel < BNB_MIN_8BIT:
        return numel * 8
    return numel * 2 + 2 * math.ceil(numel / BNB_BLOCK) * 4


def tensor_sizes(plan: Plan) -> list[int]:
    """The numel of every trainable tensor (the 8-bit layout is per tensor)."""
    s = plan.shape
    if plan.lora:
        return adapter_sizes(plan)
    layers = [size for layer in range(s.layers) for size in (*s.layer_tensors(layer), *s.layer_norms())]
    return layers + [s.embedding(), s.hidden] + ([] if s.tied else [s.embedding()])


def adapter_sizes(plan: Plan) -> list[int]:
    """The LoRA adapters' tensors: A and B of each targeted linear in every layer (a mixture's dense layers' MLP
    too), and of each fused expert tensor in every MoE layer."""
    s, r = plan.shape, plan.lora_r

    def pairs(linears: dict[str, tuple[int, int]]) -> list[int]:
        return [size for n, (a, b) in linears.items() if n in plan.lora_targets for size in (r * a, r * b)]

    found = pairs(s.linears()) * s.layers + (pairs(s.mlp()) * s.dense_layers if s.experts else [])
    if EXPERTS in plan.lora_targets:
        found += [s.experts * r * size for a, b in s.fused_experts().values() for size in (a, b)] * s.moe_layers
    return found


def optimizer_bytes(plan: Plan) -> int:
    params, tensors = trainable(plan)
    name = plan.optim
    if plan.zero_offload != "none":
        return 0
    ranks = zero_ranks(plan)
    adam = not ("8bit" in name or name.startswith(("sgd", "adafactor")))
    if ranks and adam:  # the fp32 master partition, exp_avg and exp_avg_sq shaped like it, a step count per group
        worst = max(ranks, key=lambda h: h.master)
        return worst.master * 12 + worst.groups * 4
    if "8bit" in name:
        sizes = tensor_sizes(plan)
        state = sum(bnb_8bit_state(n) for n in sizes)
        state += 2 * BNB_BLOCK * 4 if max(sizes, default=0) >= BNB_MIN_8BIT else 0  # its two quantization maps, shared
    elif name.startswith("sgd"):
        state = 0
    elif name.startswith("adafactor"):
        state = params // max(plan.shape.hidden, 1) * 8 + tensors * 4  # factored rows and columns
    else:  # AdamW and the like: exp_avg and exp_avg_sq in the parameter's dtype (fp32), a step count per tensor
        state = params * 8 + tensors * 4
    if plan.zero_stage:  # DeepSpeed's fp32 master copy of the weights it updates
        state += params * 4
    return state // shards(plan, "optimizer")


def rows(plan: Plan) -> int:
    """Sequences one forward pass carries: the batch, twice it for pair methods."""
    method = of(plan.method)
    paired = method.data == "pairs" and not method.unpaired  # chosen and rejected as one batch of twice the rows
    return plan.batch * (2 if paired else 1)


def seq_tokens(plan: Plan) -> int:
    return plan.seq_len + plan.rl_new_tokens


def attention_bytes_per_token(plan: Plan) -> int:
    """Attention's saved q, k, v and output (in the compute dtype) and its fp32 log-sum-exp and the two norms' fp32
    reciprocal roots, per token; eager attention's scores too."""
    s, c = plan.shape, plan.compute_bytes
    # SDPA takes grouped k, v as they are without a mask (Transformers' use_gqa_in_sdpa); with one, and eager, see
    # them repeated to every head; flash-attention never repeats them
    repeated = plan.attn == "eager" or (plan.record_mask and not plan.attn.startswith("flash"))
    attention = (2 * s.heads + 2 * (s.heads if repeated else s.kv_heads)) * s.dim
    scores = s.heads * seq_tokens(plan) * (4 + c) if plan.attn == "eager" else 0  # softmax and its cast
    # Qwen3's per-head RMSNorms on q and k: each one's fp32 input and its output (under autocast: the compute dtype)
    qk_norms = (s.heads + s.kv_heads) * s.dim * (4 + (4 if c == 4 else c)) if s.qk_norm else 0
    return attention * c + (2 + s.heads) * 4 + scores + qk_norms


def layer_bytes_per_token(plan: Plan) -> int:
    """What one decoder layer saves for the backward pass per token (Transformers' Llama layer, counted on the real
    model): fp32 runs save 6 hidden-sized tensors (norm inputs and outputs, attention output and its projection's
    input), attention's q, k, v, output and log-sum-exp, and 4 intermediate-sized MLP tensors; under autocast 4 of
    the hidden-sized stay fp32 (RMSNorm computes in fp32) and 5 compute-dtype copies feed the linears."""
    if plan.lora:
        return lora_layer_bytes_per_token(plan)
    s, c = plan.shape, plan.compute_bytes
    hidden = 6 * s.hidden * 4 if c == 4 else 4 * s.hidden * 4 + 5 * s.hidden * c
    return hidden + mlp_bytes_per_token(plan, 4) + attention_bytes_per_token(plan)


def mlp_bytes_per_token(plan: Plan, expert_bytes: int) -> int:
    """A layer's MLP per token, averaged over the layers: a dense one saves 4 intermediate-sized tensors in the
    compute dtype; a mixture's routed experts (counted on Qwen3-MoE's block with saved-tensor hooks), for each of a
    token's k experts, its gathered input, gate_up's output, the activation, the product and the down projection's
    output, in the experts' weights' dtype (`expert_bytes`: grouped_mm computes in it, autocast or not), with the
    router's fp32 probabilities and the routing's indices; eager adds each expert's copy of its input, batched_mm
    each token's k copies of its experts' weights."""
    s = plan.shape
    dense = 4 * s.intermediate * plan.compute_bytes
    if not s.experts:
        return dense
    k, h, w = s.top_k, s.hidden, s.expert_intermediate
    routed = (2 * k * h + 4 * k * w) * expert_bytes + s.experts * 4 + 28 * k
    routed += {"eager": k * h, "batched_mm": k * 3 * h * w}.get(plan.moe_impl, 0) * expert_bytes
    return (routed * s.moe_layers + dense * s.dense_layers) // s.layers


def expert_copy_bytes(plan: Plan) -> int:
    """LoRA on fused experts (PEFT's ParamWrapper) computes each MoE layer's weights again as base + adapter on
    every forward, one tensor the size of the layer's experts, which the matmuls keep for the backward pass."""
    s = plan.shape
    if not (plan.lora and s.experts and EXPERTS in plan.lora_targets):
        return 0
    return s.experts * sum(a * b for a, b in s.fused_experts().values()) * plan.compute_bytes


def lora_layer_bytes_per_token(plan: Plan) -> int:
    """A LoRA layer (counted on the real model with PEFT's adapters): the frozen base saves no linear's input, only
    one fp32 norm input, attention's tensors and the MLP's gate, its activation and up (fp32 under QLoRA:
    bitsandbytes' 4-bit matmul answers in its fp32 input's dtype). Each targeted linear adds its dropout's mask and
    output (PEFT casts the input to the adapters' fp32 first; autocast keeps a compute-dtype copy for A), and A's
    output (r values); without dropout the adapters read the inputs the layer has (one copy per input in fp32, one
    cast per adapter under autocast)."""
    s, c = plan.shape, plan.compute_bytes
    base = 4 if plan.quant != "none" else c
    mlp = mlp_bytes_per_token(plan, base) if s.experts else 3 * s.intermediate * base
    linears = s.linears()
    targets = [name for name in plan.lora_targets if name in linears]
    adapters = 0
    for name in targets:
        width = linears[name][0]
        adapters += plan.lora_r * c + width * (plan.dropout_mask_bytes + c if plan.lora_dropout else 0)
    if not plan.lora_dropout and c == 4:  # q, k, v read one input, gate and up another
        shared = {"q_proj": "attn", "k_proj": "attn", "v_proj": "attn", "gate_proj": "mlp", "up_proj": "mlp"}
        adapters += sum({shared.get(n, n): linears[n][0] for n in targets}.values()) * 4
    elif not plan.lora_dropout:
        adapters += sum(linears[n][0] for n in targets) * c
    return s.hidden * 4 + mlp + adapters + attention_bytes_per_token(plan)


def residual_bytes(plan: Plan) -> int:
    """The residual stream's bytes per value (what checkpointing keeps per layer): fp32 under fp32 master weights,
    the compute dtype's on a LoRA base held in it, fp32 on QLoRA's base (PEFT's prepare_model_for_kbit_training)."""
    return plan.compute_bytes if plan.lora and plan.quant == "none" else 4


def head_bytes_per_token(plan: Plan) -> int:
    """Saved after the last layer per token: the final norm's input and output, the LM head's input, the labels (a
    frozen norm and LM head save only the norm's fp32 input)."""
    s, c = plan.shape, plan.compute_bytes
    if plan.lora:
        return s.hidden * 4 + 4 + 16
    return (2 * s.hidden * 4 + s.hidden * c if c != 4 else 3 * s.hidden * 4) + 4 + 16


def activation_parts(plan: Plan) -> tuple[int, int]:
    """(saved by the forward pass, recomputed at once in the backward pass) for one micro-batch. With checkpointing
    each layer keeps only its input; the backward pass recomputes one layer at a time."""
    s = plan.shape
    tokens = rows(plan) * seq_tokens(plan)
    rotary = seq_tokens(plan) * 2 * s.dim * 4  # cos and sin, per position
    rotary += rows(plan) * seq_tokens(plan) ** 2 if plan.record_mask else 0  # a boolean mask per sequence
    head = tokens * head_bytes_per_token(plan)
    layer = tokens * layer_bytes_per_token(plan) + expert_copy_bytes(plan)
    if plan.grad_ckpt:
        return s.layers * tokens * s.hidden * residual_bytes(plan) + head, layer + rotary
    return s.layers * layer + rotary + head, 0


def autocast_copies(plan: Plan) -> tuple[int, int]:
    """Autocast's compute-dtype copies of fp32 weights, kept by the forward for the backward pass: (kept through
    the whole backward pass, recast one layer at a time under checkpointing). The LM head's is kept; the layers' are
    recast while recomputing under checkpointing. A LoRA base is already in the compute dtype (its fp32 adapters are
    cast), QLoRA's LM head is fp32 (PEFT's preparation) and cast."""
    s = plan.shape
    if plan.compute_bytes == 4:
        return 0, 0
    if plan.lora:
        layers = adapter_params(plan)[0] * 2
        head = s.embedding() * 2 if plan.quant != "none" else 0
    else:
        linears = sum(a * b for a, b in s.quantizable()) + s.experts * s.hidden * s.moe_layers  # and the routers
        layers = linears * 2 // shards(plan, "weights")
        head = s.embedding() * 2 // shards(plan, "weights")
    return (head, layers // s.layers) if plan.grad_ckpt else (head + layers, 0)


def autocast_copy_bytes(plan: Plan) -> int:
    return sum(autocast_copies(plan))


def logits_bytes(plan: Plan) -> int:
    """The loss over the vocabulary: logits in the compute dtype, their fp32 copy (mixed precision), the fp32
    log-softmax and its gradient. The chunked cross-entropy (`loss_chunk_tokens`) holds one chunk's worth."""
    tokens = rows(plan) * seq_tokens(plan)
    held = min(tokens, plan.loss_chunk_tokens) if plan.loss_chunk_tokens else tokens
    per_element = plan.compute_bytes + (4 if plan.compute_bytes != 4 else 0) + 4 + 4
    return held * plan.shape.vocab * per_element


def method_bytes(plan: Plan) -> int:
    """A reference model (a frozen copy, or the starting adapter) and its logits; GRPO's KV cache while generating."""
    s, c = plan.shape, plan.compute_bytes
    extra = 0
    if plan.reference == "frozen copy":
        extra += replace(plan, lora=False, zero_stage=0).shape.total() * (4 if not plan.lora else c)
    elif plan.reference == "frozen adapter":
        extra += adapter_params(plan)[0] * 4
    if plan.reference in ("frozen copy", "frozen adapter"):
        extra += rows(plan) * seq_tokens(plan) * s.vocab * c
    if plan.rl_new_tokens and plan.rl_engine == "transformers":  # vLLM generates in its own share (or a server)
        extra += plan.batch * seq_tokens(plan) * 2 * s.layers * s.kv_heads * s.dim * c
    return extra


def predict(plan: Plan) -> Prediction:
    saved, recomputed = activation_parts(plan)
    parts = {
        "weights": weights_bytes(plan),
        "gradients": gradient_bytes(plan),
        "optimizer": optimizer_bytes(plan),
        "activations": saved + recomputed,
        "autocast_copies": autocast_copy_bytes(plan),
        "logits_and_loss": logits_bytes(plan),
        "method_extras": method_bytes(plan),
    }
    parts["framework"] = CONTEXT_BYTES + int(FRAGMENTATION * sum(parts.values()))
    if plan.vllm_bytes:  # vLLM's own pool, sized by it up front: no fragmentation of the run's allowance
        parts["vllm_colocated"] = plan.vllm_bytes
    return Prediction(plan, parts)
