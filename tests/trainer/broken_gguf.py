"""`python tests/trainer/broken_gguf.py TENSOR FACTOR ARGS...`: `python -m trainer ARGS...` with one tensor of the
converter's GGUF file scaled by FACTOR after llama.cpp's converter wrote it (gguf-py's reader, in place), before the
quantizer reads it: a conversion broken the way a wrong tensor would break it. Everything else is the real export."""

from __future__ import annotations

import sys
from pathlib import Path

import trainer.export.gguf as gguf_tools
from trainer.__main__ import main

tensor, factor = sys.argv[1], float(sys.argv[2])
real_convert = gguf_tools.convert


def convert_then_scale(tool: gguf_tools.Tools, folder: Path, out: Path, dtype_name: str, name: str = "") -> Path:
    path = real_convert(tool, folder, out, dtype_name, name)
    sys.path.insert(0, str(tool.converter / "gguf-py"))
    from gguf import GGUFReader

    found = [t for t in GGUFReader(path, "r+").tensors if t.name == tensor]
    assert found, f"no tensor {tensor} in {path}"
    found[0].data[...] = found[0].data * factor
    found[0].data.flush() if hasattr(found[0].data, "flush") else None
    print(f"broken_gguf: scaled {tensor} by {factor} in {path.name}", file=sys.stderr)
    return path


gguf_tools.convert = convert_then_scale
sys.argv = ["trainer", *sys.argv[3:]]
sys.exit(main())
