"""GGUF files through llama.cpp's own tools, at the version images/versions.toml pins (`[llama_cpp]`).

- The converter: convert_hf_to_gguf.py with its `conversion` and `gguf-py` packages, from the llama.cpp sources that
  llama-cpp-python's source package carries (scripts/setup_llama_cpp.py unpacks them into a cache folder and builds
  the package there once); run in a child process by trainer/export/gguf_convert.py.
- The quantizer: llama.cpp's llama_model_quantize, through the llama_cpp binding of that same build (no separate
  binary). Types are llama.cpp's own names (LLAMA_FTYPE_MOSTLY_<NAME>), lower-cased.

The converter writes the export once, in its own dtype (f32 for an fp32 model, else bf16/f16: nothing rounded);
every asked type is quantized from that file.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from trainer.errors import ConfigError
from trainer.export import in_image

log = logging.getLogger("trainer")

LLAMA_CPP_ENV = "TRAINKIT_LLAMA_CPP"  # the folder with convert_hf_to_gguf.py (scripts/setup_llama_cpp.py prints it)
SETUP_HINT = "install it with `python scripts/setup_llama_cpp.py` (builds the pinned llama-cpp-python once, cached)"
# llama.cpp's file types: the name export takes -> the LLAMA_FTYPE_* constant's suffix
GGUF_TYPES = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0",
              "q6_k": "MOSTLY_Q6_K", "q5_k_m": "MOSTLY_Q5_K_M", "q5_k_s": "MOSTLY_Q5_K_S", "q5_0": "MOSTLY_Q5_0",
              "q5_1": "MOSTLY_Q5_1", "q4_k_m": "MOSTLY_Q4_K_M", "q4_k_s": "MOSTLY_Q4_K_S", "q4_0": "MOSTLY_Q4_0",
              "q4_1": "MOSTLY_Q4_1", "q3_k_l": "MOSTLY_Q3_K_L", "q3_k_m": "MOSTLY_Q3_K_M", "q3_k_s": "MOSTLY_Q3_K_S",
              "q2_k": "MOSTLY_Q2_K", "iq4_nl": "MOSTLY_IQ4_NL"}  # fmt: skip
SOURCE_TYPE = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}  # the converter's lossless outtype
# Bits per weight of each type's main block layout (llama.cpp's ggml-common.h: q8_0 is 34 bytes per 32 weights, q4_k
# 144 per 256, ...): what a full disk's message estimates a file at; the _m/_s mixes keep some tensors wider.
BITS_PER_WEIGHT = {"f32": 32, "f16": 16, "bf16": 16, "q8_0": 8.5, "q6_k": 6.5625, "q5_k_m": 5.5, "q5_k_s": 5.5,
                   "q5_0": 5.5, "q5_1": 6.0, "q4_k_m": 4.5, "q4_k_s": 4.5, "q4_0": 4.5, "q4_1": 5.0, "q3_k_l": 3.4375,
                   "q3_k_m": 3.4375, "q3_k_s": 3.4375, "q2_k": 2.625, "iq4_nl": 4.5}  # fmt: skip


@dataclass(frozen=True)
class Tools:
    converter: Path  # the llama.cpp folder with convert_hf_to_gguf.py, conversion/ and gguf-py/
    version: str  # llama-cpp-python's version (its llama.cpp is the one it vendors)

    @property
    def runtime(self) -> str:
        return f"llama.cpp (llama-cpp-python {self.version})"


def default_folder(version: str) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "trainkit" / "llama-cpp" / version / "llama.cpp"


def tools(types: list[str]) -> Tools:
    """The converter and the llama_cpp binding, or ConfigError (exit 2) saying how to install them."""
    try:
        import llama_cpp
    except ImportError:
        refusal = in_image.refusal("llama_cpp", types, "llama.cpp", "org.trainkit.gguf-export", SETUP_HINT)
        raise ConfigError(refusal or f"export --quant {','.join(types)}: llama-cpp-python is not installed; "
                          f"{SETUP_HINT}") from None  # fmt: skip
    version = str(llama_cpp.__version__)
    folder = Path(os.environ.get(LLAMA_CPP_ENV) or default_folder(version))
    if not (folder / "convert_hf_to_gguf.py").is_file():
        where = f"{LLAMA_CPP_ENV}={folder}" if os.environ.get(LLAMA_CPP_ENV) else str(folder)
        raise ConfigError(f"export --quant {','.join(types)}: llama.cpp's converter is not in {where} (no "
                          f"convert_hf_to_gguf.py); {SETUP_HINT}")  # fmt: skip
    stamp = folder / "VERSION"
    if stamp.is_file() and stamp.read_text().strip() != version:
        raise ConfigError(f"export --quant: the converter in {folder} is llama-cpp-python {stamp.read_text().strip()}"
                          f"'s, the installed binding is {version}; {SETUP_HINT}")  # fmt: skip
    return Tools(folder, version)


def _convert_run(tool: Tools, model: Path, out: str, outtype: str, name: str = "") -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "trainer.export.gguf_convert", str(tool.converter), str(model), out, outtype,
            *([name] if name else [])]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def check_convertible(tool: Tools, folder: Path) -> None:
    """Exit 2 before any work when the converter cannot take `folder`'s architecture or tokenizer (config.json and
    the tokenizer files: its vocabulary alone is converted, into nothing kept)."""
    result = _convert_run(tool, folder, "--check", "f32")
    _raise_unsupported(result, tool, folder)


def _raise_unsupported(result: subprocess.CompletedProcess[str], tool: Tools, folder: Path) -> None:
    from trainer.export.gguf_convert import UNSUPPORTED_EXIT

    if result.returncode == UNSUPPORTED_EXIT:
        what = result.stdout.strip().removeprefix("unsupported: ")
        raise ConfigError(f"export --quant (GGUF): llama.cpp's converter ({tool.runtime}) cannot take {folder}: "
                          f"{what}; export without a GGUF type, or convert a model it supports")  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"llama.cpp's converter failed on {folder} (exit {result.returncode}):\n"
                           f"{result.stderr[-3000:]}")  # fmt: skip


def convert(tool: Tools, folder: Path, out: Path, dtype_name: str, name: str = "") -> Path:
    """`folder` (a written export) -> one GGUF file in its own dtype, written by llama.cpp's converter; `name`: the
    file's general.name (OUT's, not the staging folder's)."""
    outtype = SOURCE_TYPE.get(dtype_name, "f32")
    result = _convert_run(tool, folder, str(out), outtype, name)
    _raise_unsupported(result, tool, folder)
    log.info("export: llama.cpp's converter wrote %s (%s)", out.name, outtype)
    return out


def quantize(tool: Tools, source: Path, out: Path, kind: str) -> Path:
    """`source` (the converter's file) -> `out` of llama.cpp type `kind`, by llama_model_quantize."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_{GGUF_TYPES[kind]}")
    params.nthread = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
    if source.name.endswith(f".{kind}.gguf"):
        shutil.copyfile(source, out)
        return out
    code = llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), params)
    if code != 0 or not out.is_file():
        raise RuntimeError(f"llama.cpp's quantizer failed to write {out.name} ({kind}): code {code}")
    log.info("export: llama.cpp's quantizer wrote %s (%.1f MB)", out.name, out.stat().st_size / 1e6)
    return out
