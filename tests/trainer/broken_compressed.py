"""`python tests/trainer/broken_compressed.py TENSOR FACTOR ARGS...`: `python -m trainer ARGS...` whose llmcompressor
child (trainer/export/compressed.py's CHILD) is this file again, which runs the real child
(trainer/export/compress_run.py) with one tensor of each written compressed-tensors folder scaled by FACTOR after
llmcompressor saved it, before it is loaded back and scored: a compressed export broken the way a wrong tensor would
break it. Everything else is the real export. The child's stderr is the export's to keep, so what it scaled is
written to a note this wrapper prints on its own stderr at the end."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

CHILD_FLAG = "--child"


def scale(folder: Path, tensor: str, factor: float) -> str:
    """`tensor` in the folder's safetensors file scaled in place (the file's metadata kept)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = folder / "model.safetensors"
    with safe_open(str(path), "pt") as f:
        metadata = f.metadata()
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
    assert tensor in tensors, f"no tensor {tensor} in {path}"
    tensors[tensor] = tensors[tensor] * factor
    save_file(tensors, str(path), metadata)
    return f"broken_compressed: scaled {tensor} by {factor} in {folder.name}/{path.name}\n"


def child(tensor: str, factor: float, note: Path, argv: list[str]) -> int:
    from trainer.export import compress_run

    real_write = compress_run.write

    def write_then_scale(model: Any, tokenizer: Any, out: str) -> None:
        real_write(model, tokenizer, out)
        with note.open("a") as sink:
            sink.write(scale(Path(out), tensor, factor))

    compress_run.write = write_then_scale
    return compress_run.main(argv)


if sys.argv[1] == CHILD_FLAG:  # the child: llmcompressor's overlay goes on sys.path in compress_run.main
    sys.exit(child(sys.argv[2], float(sys.argv[3]), Path(sys.argv[4]), sys.argv[5:]))

import tempfile  # noqa: E402

import trainer.export.compressed as compressed  # noqa: E402
from trainer.__main__ import main  # noqa: E402

note = Path(tempfile.mkstemp(prefix="broken_compressed.")[1])
compressed.CHILD = (str(Path(__file__).resolve()), CHILD_FLAG, sys.argv[1], sys.argv[2], str(note))
sys.argv = ["trainer", *sys.argv[3:]]
try:
    code = main()
finally:
    sys.stderr.write(note.read_text())
    note.unlink()
sys.exit(code)
