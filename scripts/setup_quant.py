"""`python scripts/setup_quant.py [--python PY] [--cache DIR]`: llmcompressor for `python -m trainer export --quant
fp8/w4a16`.

Installs images/versions.toml's [llmcompressor] wheels (pip --no-deps --require-hashes: llmcompressor,
compressed-tensors and the Transformers and huggingface-hub they need, which differ from the training stack's) into an
overlay folder,
CACHE/site, once; later calls check its stamp and return at once. The trainer runs llmcompressor in a child process
with that folder ahead of the training stack's site-packages, so the rest (torch, datasets, accelerate, ...) is PY's
own: the probe checks each of those against llmcompressor's requirements in PY's environment and imports it. CACHE
defaults to $XDG_CACHE_HOME/trainkit/llmcompressor (~/.cache/...), where the trainer looks (else
TRAINKIT_LLMCOMPRESSOR names the overlay folder). Prints the overlay folder. Stdlib only; pip does the downloads.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
STAMP = "TRAINKIT_PINS.json"  # the pins an overlay holds (trainer/export/compressed.py reads it)
# Run in PY with the overlay first: every pinned wheel at its version, llmcompressor's other requirements met by PY's
# own packages (all but the ones left out), and (after an install) llmcompressor importable. One line per problem.
PROBE = """
import importlib.metadata as md, json, sys
from packaging.requirements import Requirement
pins = json.loads(sys.argv[1])
problems = [f"{name} is {md.version(name)} in the overlay, not {want}" for name, want in pins["wanted"].items()
            if md.version(name) != want]
for text in md.requires("llmcompressor") or []:
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}) or req.name in pins["left_out"]:
        continue
    try:
        have = md.version(req.name)
    except md.PackageNotFoundError:
        problems.append(f"{req.name} (llmcompressor asks {req}) is not installed")
        continue
    if not req.specifier.contains(have, prereleases=True):
        problems.append(f"{req.name} {have} is installed; llmcompressor asks {req}")
if not problems and pins["import"]:
    import llmcompressor.modifiers.quantization  # noqa
print("\\n".join(problems))
sys.exit(1 if problems else 0)
"""


def default_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trainkit" / "llmcompressor"


def _pins() -> dict[str, object]:
    table = tomllib.loads((ROOT / "images" / "versions.toml").read_text())["llmcompressor"]
    return {"version": table["version"], "wheels": dict(table["wheels"]), "left_out": list(table["left_out"])}


def _probe(python: str, folder: Path, pins: dict[str, object], imports: bool) -> str:
    """'' when the overlay and PY's environment together hold what llmcompressor needs, else the problems."""
    wheels = pins["wheels"]
    assert isinstance(wheels, dict)
    wanted = dict(requirement.split("==") for requirement in wheels)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))}
    argv = [python, "-c", PROBE, json.dumps({"wanted": wanted, "left_out": pins["left_out"], "import": imports})]
    result = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    return "" if result.returncode == 0 else (result.stdout.strip() or result.stderr[-3000:])


def _install(python: str, folder: Path, pins: dict[str, object]) -> None:
    wheels = pins["wheels"]
    assert isinstance(wheels, dict)
    staging = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    requirements = staging.parent / "requirements.txt"
    requirements.write_text("".join(f"{name} --hash=sha256:{digest}\n" for name, digest in wheels.items()))
    start = time.monotonic()
    print(f"installing llmcompressor {pins['version']}'s overlay into {folder} (once)", file=sys.stderr, flush=True)
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--require-hashes", "--only-binary", ":all:",
                    "--no-compile", "--target", str(staging), "-r", str(requirements)], check=True)  # fmt: skip
    (staging / STAMP).write_text(json.dumps(pins, indent=1) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    os.rename(staging, folder)
    print(f"installed in {time.monotonic() - start:.0f} s", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the training environment's python")
    parser.add_argument("--cache", type=Path, default=None, help="the cache folder (default: %(default)s)")
    args = parser.parse_args(argv)
    pins = _pins()
    folder = (args.cache or default_cache()) / "site"
    stamp = folder / STAMP
    fresh = not stamp.is_file() or json.loads(stamp.read_text()) != pins
    if fresh:
        _install(args.python, folder, pins)
    problems = _probe(args.python, folder, pins, imports=fresh)
    if problems:
        print(f"error: llmcompressor's overlay in {folder} does not fit {args.python}'s environment:\n{problems}",
              file=sys.stderr)  # fmt: skip
        return 2
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
