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

The image build runs this same file (the Dockerfile's llmcompressor step) with --pins-from-env (the LLMCOMPRESSOR_*
build args), --compile (the image's users cannot write bytecode there) and --claim: where the row's environment does
not meet llmcompressor's requirements (torch below 2.10 on the older NGC rows), the overlay is removed and the claim
says why, so the image refuses `--quant fp8/w4a16` naming its row instead of failing in llmcompressor.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

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


def _pins(from_env: bool) -> dict[str, object]:
    if from_env:  # the image build's LLMCOMPRESSOR_* build args (scripts/matrix.py's dockerfile_defaults)
        wheels = dict(word.rsplit(":", 1) for word in os.environ["LLMCOMPRESSOR_WHEELS"].split())
        return {"version": os.environ["LLMCOMPRESSOR_VERSION"], "wheels": wheels,
                "left_out": os.environ.get("LLMCOMPRESSOR_LEFT_OUT", "").split()}  # fmt: skip
    import tomllib  # not at the top: the image build runs this on Python 3.10 rows too

    table = tomllib.loads((ROOT / "images" / "versions.toml").read_text())["llmcompressor"]
    return {"version": table["version"], "wheels": dict(table["wheels"]), "left_out": list(table["left_out"])}


def plan_verdict(torch: str, version: str, wanted_torch: str) -> str:
    """build.py's plan line for a row: its torch against llmcompressor's torch range (images/versions.toml's
    [llmcompressor] torch, the wheel's own), by the probe's rule (as pip reads a pre-release); the rest of its
    requirements the build's probe checks."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    tool, wanted = f"llmcompressor {version}", SpecifierSet(wanted_torch)
    try:
        found = Version(torch)
    except InvalidVersion:  # a base outside the matrix: its torch is read in the build
        return f"through {tool} where the base's torch is within its torch{wanted}: decided in the build"
    if not wanted.contains(found, prereleases=True):
        return f"refused: torch {torch} is outside {tool}'s torch{wanted} (the image carries no llmcompressor)"
    return f"through {tool} (torch {torch} is within its torch{wanted}; the rest is checked in the build)"


def build_arg_wheels(wheels: dict[str, str]) -> str:
    """[llmcompressor.wheels] as the LLMCOMPRESSOR_WHEELS build arg: `name==version:sha256` words."""
    return " ".join(f"{requirement}:{digest}" for requirement, digest in wheels.items())


def _probe(python: str, folder: Path, pins: dict[str, object], imports: bool) -> str:
    """'' when the overlay and PY's environment together hold what llmcompressor needs, else the problems."""
    wheels = pins["wheels"]
    assert isinstance(wheels, dict)
    wanted = dict(requirement.split("==") for requirement in wheels)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))}
    argv = [python, "-c", PROBE, json.dumps({"wanted": wanted, "left_out": pins["left_out"], "import": imports})]
    result = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    return "" if result.returncode == 0 else (result.stdout.strip() or result.stderr[-3000:])


def _install(python: str, folder: Path, pins: dict[str, object], compile_bytecode: bool) -> str:
    """'' once the overlay is in `folder`, else what pip said."""
    wheels = pins["wheels"]
    assert isinstance(wheels, dict)
    staging = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    requirements = staging.parent / "requirements.txt"
    requirements.write_text("".join(f"{name} --hash=sha256:{digest}\n" for name, digest in wheels.items()))
    start = time.monotonic()
    print(f"installing llmcompressor {pins['version']}'s overlay into {folder} (once)", file=sys.stderr, flush=True)
    argv = [python, "-m", "pip", "install", "-q", "--no-deps", "--require-hashes", "--only-binary", ":all:",
            *([] if compile_bytecode else ["--no-compile"]), "--target", str(staging), "-r", str(requirements)]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    requirements.unlink()
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        return f"pip could not install the overlay (exit {result.returncode}): {result.stderr.strip()[-1500:]}"
    (staging / STAMP).write_text(json.dumps(pins, indent=1) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    os.rename(staging, folder)
    print(f"installed in {time.monotonic() - start:.0f} s", file=sys.stderr)
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the training environment's python")
    parser.add_argument("--cache", type=Path, default=None, help="the cache folder (default: %(default)s)")
    parser.add_argument("--pins-from-env", action="store_true", help="the pins from LLMCOMPRESSOR_* (the image build)")
    parser.add_argument("--compile", action="store_true", help="write the overlay's bytecode (the image)")
    parser.add_argument("--claim", type=Path, help="write what was done (or why not) as a build-manifest claim")
    args = parser.parse_args(argv)
    pins = _pins(args.pins_from_env)
    folder = (args.cache or default_cache()) / "site"
    stamp = folder / STAMP
    fresh = not stamp.is_file() or json.loads(stamp.read_text()) != pins
    problems = _install(args.python, folder, pins, args.compile) if fresh else ""
    problems = problems or _probe(args.python, folder, pins, imports=fresh)
    if problems and args.claim is not None:
        shutil.rmtree(folder, ignore_errors=True)  # nothing of it can be used
        with contextlib.suppress(OSError):
            folder.parent.rmdir()  # the image's /opt/llmcompressor, when nothing else is in it
        reason = f"llmcompressor {pins['version']} does not fit this environment: {'; '.join(problems.splitlines())}"
        _write_claim(args.claim, {"status": "skipped", "version": pins["version"], "reason": reason})
        return 0
    if problems:
        print(f"error: llmcompressor's overlay in {folder} does not fit {args.python}'s environment:\n{problems}",
              file=sys.stderr)  # fmt: skip
        return 2
    _write_claim(args.claim, {"status": "built", "version": pins["version"], "overlay": str(folder),
                              "wheels": pins["wheels"]})  # fmt: skip
    print(folder)
    return 0


def _write_claim(path: Path | None, claim: dict[str, object]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(claim, indent=2) + "\n")
    print(f"claim llmcompressor: {json.dumps(claim)}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
