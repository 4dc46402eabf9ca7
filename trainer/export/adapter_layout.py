"""`export --adapter-only`: the adapter as vLLM's LoRA loader takes it (`vllm serve --enable-lora --lora-modules`,
`serve OUT`), or a refusal before anything is published, naming what vLLM refuses and the way out: merge.

PEFT's own layout (adapter_config.json, adapter_model.safetensors with base_model.model.<module>.lora_A/B.weight) is
vLLM's. What vLLM 0.31 refuses (vllm/lora/peft_helper.py, lora_model.py, config/lora.py): modules_to_save other than
a classifier's head (whole modules trained beside the adapter, such as an lm_head or embed_tokens), DoRA, trained
biases, a rank above 512, and any tensor that is no LoRA matrix (the whole embeddings and LM head PEFT saves beside
an adapter when the run resized the vocabulary): it ends with "... is unsupported LoRA weight".

An adapter on parameters (PEFT's target_parameters: a mixture's fused routed experts, its routers) is refused too,
though vLLM loads it: vLLM reads a fused gate_up_proj adapter as interleaved gate/up rows on the families it does not
mark 3D-MoE (Qwen3-MoE, OLMoE, Mixtral and DeepSeek store them concatenated: served, it would compute something else;
vllm/lora/model_manager.py's _stack_moe_lora_weights), runs fused-MoE LoRA only in Triton (CUDA) kernels, which this
project cannot run to prove gpt-oss's, and has no router LoRA.
"""

from __future__ import annotations

import json
from pathlib import Path

from trainer.errors import ConfigError

LORA_TENSORS = (".lora_A.weight", ".lora_B.weight", ".lora_embedding_A", ".lora_embedding_B")
SKIPPED = (".embed_tokens.base_layer.weight", ".lm_head.base_layer.weight")  # vLLM passes over these
HEADS = ("classifier", "score")  # the only modules_to_save vLLM takes (classification models)
MAX_RANK = 512


def problems(config: dict, tensors: list[str]) -> list[str]:
    """What vLLM's loader refuses in an adapter with this adapter_config.json and these tensor names."""
    found = []
    targets = config.get("target_parameters") or []
    if targets:
        found.append(f"it adapts parameters ({', '.join(targets)}: a mixture of experts' fused experts or routers), "
                     "which vLLM does not read as trained (fused gate_up_proj split as interleaved rows, MoE LoRA in "
                     "CUDA kernels only, no router LoRA)")  # fmt: skip
    saved = [m for m in config.get("modules_to_save") or [] if m not in HEADS]
    if saved:
        found.append(f"modules_to_save {saved} (whole modules trained beside the LoRA matrices)")
    if config.get("use_dora"):
        found.append("DoRA (use_dora)")
    if config.get("bias", "none") != "none":
        found.append(f"trained biases (bias={config['bias']!r})")
    if int(config.get("r") or 0) > MAX_RANK:
        found.append(f"rank {config['r']} (at most {MAX_RANK})")
    other = [n for n in tensors if not n.endswith(LORA_TENSORS + SKIPPED) and n.split(".")[-2] not in HEADS]
    if other and not saved:
        found.append(f"{len(other)} tensors that are no LoRA matrix, first {other[0]} (PEFT saves the whole "
                     "embeddings beside an adapter when the run resized the vocabulary)")  # fmt: skip
    return found


def check(folder: Path, source: Path) -> None:
    """ConfigError (exit 2) when vLLM cannot load the adapter in `folder` (copied from `source`)."""
    from safetensors import safe_open

    config = json.loads((folder / "adapter_config.json").read_text())
    with safe_open(str(folder / "adapter_model.safetensors"), "pt") as weights:
        names = list(weights.keys())
    refused = problems(config, names)
    if refused:
        raise ConfigError(f"export --adapter-only: vLLM cannot serve the adapter of {source} as trained: "
                          f"{'; '.join(refused)}. Export without --adapter-only: the adapter merged into its base "
                          "is a model folder vLLM, llama.cpp (--quant) and Transformers all load")  # fmt: skip
