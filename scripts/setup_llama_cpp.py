"""`python scripts/setup_llama_cpp.py [--python PY] [--cache DIR]`: llama.cpp for `python -m trainer export --quant`.

From the pinned, hashed llama-cpp-python source package (images/versions.toml's [llama_cpp]): its llama.cpp's
converter (convert_hf_to_gguf.py, conversion/, gguf-py/) unpacked into CACHE/VERSION/llama.cpp, and the package
built once into a wheel in CACHE/VERSION/wheel (minutes of C++; later calls reuse it), installed into PY's
environment (default: this Python's). CACHE defaults to $XDG_CACHE_HOME/trainkit/llama-cpp (~/.cache/...), where
the trainer looks for the converter of the installed binding's version (else TRAINKIT_LLAMA_CPP names the folder).
Prints the converter's folder. Stdlib only; pip does the downloads (--require-hashes) and the build.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
CONVERTER_PARTS = ("convert_hf_to_gguf.py", "conversion", "gguf-py", "LICENSE")


def default_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trainkit" / "llama-cpp"


def _pip(python: str, *args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run([python, "-m", "pip", *args], check=True, env=env)


def _sdist(python: str, cache: Path, version: str, digest: str) -> Path:
    folder = cache / "sdist"
    found = sorted(folder.glob(f"llama_cpp_python-{version}.tar.gz"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    requirement = folder / "requirement.txt"
    requirement.write_text(f"llama-cpp-python=={version} --hash=sha256:{digest}\n")
    _pip(python, "download", "-q", "--no-deps", "--no-binary", ":all:", "--require-hashes", "-r", str(requirement),
         "-d", str(folder))  # fmt: skip
    return folder / f"llama_cpp_python-{version}.tar.gz"


def _unpack_converter(sdist: Path, target: Path, version: str) -> None:
    if (target / "VERSION").is_file():
        return
    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers()
                   if m.name.startswith(prefix) and m.name[len(prefix):].split("/")[0] in CONVERTER_PARTS]  # fmt: skip
        for member in members:
            member.name = member.name[len(prefix):]
        archive.extractall(staging, members=members, filter="data")
    (staging / "VERSION").write_text(version + "\n")
    shutil.rmtree(target, ignore_errors=True)
    os.rename(staging, target)


def _wheel(python: str, sdist: Path, folder: Path, version: str, cmake_args: str) -> Path:
    found = sorted(folder.glob(f"llama_cpp_python-{version}-*.whl"))
    if found:
        return found[0]
    start = time.monotonic()
    print(f"building llama-cpp-python {version} (llama.cpp's C++, once; minutes)", file=sys.stderr, flush=True)
    env = {**os.environ, "CMAKE_ARGS": cmake_args,
           "CMAKE_BUILD_PARALLEL_LEVEL": str(len(os.sched_getaffinity(0)))}  # fmt: skip
    _pip(python, "wheel", "-q", "--no-deps", str(sdist), "-w", str(folder), env=env)
    print(f"built in {time.monotonic() - start:.0f} s", file=sys.stderr)
    return sorted(folder.glob(f"llama_cpp_python-{version}-*.whl"))[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the environment to install into (its python)")
    parser.add_argument("--cache", type=Path, default=None, help="the cache folder (default: %(default)s)")
    args = parser.parse_args(argv)
    pins = tomllib.loads((ROOT / "images" / "versions.toml").read_text())["llama_cpp"]
    version = pins["version"]
    cache = (args.cache or default_cache()) / version
    sdist = _sdist(args.python, cache, version, pins["sdist_sha256"])
    _unpack_converter(sdist, cache / "llama.cpp", version)
    wheel = _wheel(args.python, sdist, cache / "wheel", version, pins["cmake_args"])
    modules = ", ".join(name.split("==")[0] for name in pins["requires"])
    probe = [args.python, "-c", f"import llama_cpp, sys, {modules}; sys.exit(llama_cpp.__version__ != {version!r})"]
    if subprocess.run(probe, capture_output=True, check=False).returncode != 0:
        _pip(args.python, "install", "-q", "--no-deps", str(wheel), *pins["requires"])
    print(cache / "llama.cpp")
    return 0


if __name__ == "__main__":
    sys.exit(main())
