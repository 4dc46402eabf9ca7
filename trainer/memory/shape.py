"""What the memory prediction knows of a model: its shape, from a preset or a model folder's config.json, torch-free.

A Llama-like decoder: attention's four linears per layer, a dense MLP (gate, up, down), two RMSNorms. A mixture of
experts (Qwen3-MoE, OLMoE, Mixtral) replaces the MLP of its MoE layers by E routed experts stored as two fused
tensors (gate_up [E, 2 x width, hidden], down [E, hidden, width]) and a router [E, hidden]; every expert's weights
are held, whatever a token passes through. Families whose attention or experts differ from these (DeepSeek's latent
attention and shared experts, gpt-oss's biases and sinks) are read as this shape: their prediction is approximate.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainer.config.moe import EXPERTS_FIELDS, TOP_K_FIELDS
from trainer.config.presets import is_vision_preset, language_preset
from trainer.memory.model_config import shape_config

BYTE_VOCAB = 259  # trainer/tokenizer.py's byte-level tokenizer: 256 bytes + bos, eos, pad
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
EXPERTS = "experts"  # a LoRA target: the routed experts' fused tensors (trainer.model.lora_targets)


@dataclass(frozen=True)
class Shape:
    """A decoder's shape: what the parameter count and the activations follow."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool
    head_dim: int = 0
    experts: int = 0  # routed experts per MoE layer (0: dense)
    top_k: int = 0
    expert_intermediate: int = 0
    dense_layers: int = 0  # layers of a mixture of experts with a dense MLP instead (Qwen3-MoE's mlp_only_layers)
    qk_norm: bool = False  # RMSNorms on each head's queries and keys (Qwen3)
    qkv_bias: bool = False  # biases on q, k and v (Qwen2's, Qwen2-VL's and Qwen2.5-VL's language models)

    @property
    def dim(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.experts else 0

    def attention(self) -> dict[str, tuple[int, int]]:
        h, q, kv = self.hidden, self.heads * self.dim, self.kv_heads * self.dim
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}

    def mlp(self) -> dict[str, tuple[int, int]]:
        h, i = self.hidden, self.intermediate
        return {"gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def linears(self) -> dict[str, tuple[int, int]]:
        """The linear modules of every layer: name -> (in_features, out_features); a dense model's MLP included."""
        return self.attention() if self.experts else {**self.attention(), **self.mlp()}

    def fused_experts(self) -> dict[str, tuple[int, int]]:
        """A MoE layer's fused expert tensors, each [E, in x out]: name -> (in, out) of one expert."""
        h, w = self.hidden, self.expert_intermediate
        return {"gate_up_proj": (h, 2 * w), "down_proj": (w, h)} if self.experts else {}

    def layer_tensors(self, layer: int) -> list[int]:
        """The weight-decayed tensors of layer `layer`, in the model's order (norms apart)."""
        sizes = [a * b for a, b in self.linears().values()]
        if self.experts and layer >= self.dense_layers:
            experts = [self.experts * a * b for a, b in self.fused_experts().values()]
            return sizes + experts + [self.experts * self.hidden]  # the fused experts, then the router
        return sizes + ([a * b for a, b in self.mlp().values()] if self.experts else [])

    def linear_params(self) -> int:
        """The layers' weights: linears, experts and routers."""
        return sum(sum(self.layer_tensors(layer)) for layer in range(self.layers))

    def quantizable(self) -> list[tuple[int, int]]:
        """(in, out) of every layer's linear modules: what bitsandbytes quantizes (not fused experts, not routers)."""
        found = list(self.linears().values()) * self.layers
        return found + list(self.mlp().values()) * self.dense_layers if self.experts else found

    def layer_norms(self) -> list[int]:
        """A layer's tensors without weight decay: its norms (and q, k and v's biases where it has them)."""
        q, kv = self.heads * self.dim, self.kv_heads * self.dim
        biases = [q, kv, kv] if self.qkv_bias else []
        return biases + [self.hidden, self.hidden] + ([self.dim, self.dim] if self.qk_norm else [])

    def embedding(self) -> int:
        return self.vocab * self.hidden

    def norms(self) -> int:
        return self.layers * sum(self.layer_norms()) + self.hidden

    def total(self) -> int:
        """Every parameter: embeddings, the layers' weights and norms, the final norm, an untied LM head."""
        return self.embedding() * (1 if self.tied else 2) + self.linear_params() + self.norms()

    def tensors(self) -> int:
        """How many parameter tensors: each layer's weights and norms, the embedding, final norm, LM head."""
        per_layer = sum(len(self.layer_tensors(layer)) for layer in range(self.layers))
        return per_layer + self.layers * len(self.layer_norms()) + 2 + (0 if self.tied else 1)


def preset_shape(name: str, vocab: int = BYTE_VOCAB) -> Shape:
    """A preset's shape as trainer/model/build.py builds it (the vocabulary rounded up to a multiple of 64); a vision
    preset's language model (Qwen2-VL's, q, k and v with biases; its tower: trainer.memory.vision_shape)."""
    p = language_preset(name)
    rows = (max(vocab, p.vocab) + 63) // 64 * 64
    return Shape(p.hidden, p.layers, p.heads, p.kv_heads, p.intermediate, rows, tied=p.hidden <= 1024,
                 experts=p.experts, top_k=p.top_k, expert_intermediate=p.expert_intermediate,
                 qk_norm=bool(p.experts), qkv_bias=is_vision_preset(name))  # fmt: skip


def folder_shape(folder: str | Path) -> Shape:
    """A model folder's shape from its config.json (Llama, Mistral, Qwen, Gemma, and the mixtures of experts that
    name their fields as Qwen3-MoE, OLMoE and Mixtral do); ShapeUnknown saying why where it cannot be read
    (trainer/memory/model_config.py)."""
    c = shape_config(folder)
    heads = int(c["num_attention_heads"])
    experts = int(next((c[f] for f in EXPERTS_FIELDS if c.get(f)), 0) or 0)
    width = int(c.get("moe_intermediate_size") or c["intermediate_size"])
    dense = len(c.get("mlp_only_layers") or []) + int(c.get("first_k_dense_replace") or 0)
    return Shape(int(c["hidden_size"]), int(c["num_hidden_layers"]), heads, int(c.get("num_key_value_heads") or heads),
                 int(c["intermediate_size"]), int(c["vocab_size"]), bool(c.get("tie_word_embeddings", False)),
                 int(c.get("head_dim") or 0), experts=experts if experts > 1 else 0,
                 top_k=int(next((c[f] for f in TOP_K_FIELDS if c.get(f)), 0) or 0), expert_intermediate=width,
                 dense_layers=dense if experts > 1 else 0,
                 qk_norm=c.get("model_type") in ("qwen3", "qwen3_moe"),
                 qkv_bias=str(c.get("model_type", "")).startswith("qwen2"))  # fmt: skip
