"""`python scripts/setup_llama_cpp.py [--python PY] [--cache DIR]`: llama.cpp for `python -m trainer export --quant`.

From the pinned, hashed llama-cpp-python source package (images/versions.toml's [llama_cpp]): its llama.cpp's
converter (convert_hf_to_gguf.py, conversion/, gguf-py/) unpacked into CACHE/VERSION/llama.cpp, and the package
built once into a wheel in CACHE/VERSION/wheel-<digest of its CMake options> (minutes of C++; later calls reuse it),
installed into PY's environment (default: this Python's). Beside the wheel, build.json says what it was built from
and for (version, sdist sha256, CMake options, Python, machine, glibc, the wheel's sha256). CACHE defaults to
$XDG_CACHE_HOME/trainkit/llama-cpp (~/.cache/...), where the trainer looks for the converter of the installed
binding's version (else TRAINKIT_LLAMA_CPP names the folder). Prints the converter's folder. Stdlib only (and no
tomllib where the pins come from the environment); pip does the downloads (--require-hashes) and the build.

The image build runs this same file (the Dockerfile's llama.cpp steps): in the builder stage with --pins-from-env
(the LLAMA_CPP_* build args), --no-install, --prebuilt (a wheel of the host's cache that build.py placed in the
context: taken, not compiled again, when its build.json matches the pins and the image's machine and glibc) and
--claim (the build manifest's llama_cpp entry: which path the build took, the wheel's sha256, or why the row cannot
carry llama.cpp); in the runtime stage with --converter-to, which installs the wheel and places the converter.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

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
    # --no-binary for this package only: with :all:, pip would build the metadata step's own build requirements
    # (scikit-build-core, hatchling, ...) from their sdists too, level after level
    _pip(python, "download", "-q", "--no-deps", "--no-binary", "llama-cpp-python", "--require-hashes", "-r",
         str(requirement), "-d", str(folder))  # fmt: skip
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
            member.name = member.name.removeprefix(prefix)
        try:
            archive.extractall(staging, members=members, filter="data")
        except TypeError:  # a Python without extraction filters (before 3.10.12)
            archive.extractall(staging, members=members)
    (staging / "VERSION").write_text(version + "\n")
    shutil.rmtree(target, ignore_errors=True)
    os.rename(staging, target)


# llama-cpp-python's CMakeLists turns llama.cpp's common library on (with FORCE: its mtmd library needs it), and with
# it cpp-httplib: more than half of the build's CPU (measured on 2 cores: 190 of 362 CPU-s) for a library the binding
# never loads (it loads libllama and libggml, and mtmd only with LLAVA_BUILD, which [llama_cpp]'s cmake_args turn off).
# CMake includes this file right after llama.cpp's own project() call, before its option(LLAMA_BUILD_COMMON), which
# then finds the option off. The sdist itself is built as hashed, unchanged.
BINDING_ONLY = "binding-only-1"
_BINDING_ONLY_CMAKE = 'set(LLAMA_BUILD_COMMON OFF CACHE BOOL "not loaded by the binding (setup_llama_cpp.py)" FORCE)\n'


def build_recipe(cmake_args: str) -> str:
    """What a wheel is built with beyond cmake_args: BINDING_ONLY where mtmd is off (nothing else needs common)."""
    return BINDING_ONLY if "-DLLAVA_BUILD=OFF" in cmake_args.split() else ""


def wheel_folder(cache: Path, cmake_args: str) -> Path:
    """CACHE/VERSION/wheel-<digest>: one folder per set of CMake options and recipe (another never reuses a wheel)."""
    key = " ".join(filter(None, (cmake_args, build_recipe(cmake_args))))
    return cache / f"wheel-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _wheel(python: str, sdist: Path, folder: Path, version: str, pins: dict) -> Path:
    found = sorted(folder.glob(f"llama_cpp_python-{version}-*.whl"))
    if found and (folder / "build.json").is_file():
        return found[0]
    start = time.monotonic()
    print(f"building llama-cpp-python {version} (llama.cpp's C++, once; minutes)", file=sys.stderr, flush=True)
    cmake_args, recipe = pins["cmake_args"], build_recipe(pins["cmake_args"])
    if recipe == BINDING_ONLY:
        include = folder.parent / f"{BINDING_ONLY}.cmake"
        include.write_text(_BINDING_ONLY_CMAKE)
        cmake_args += f" -DCMAKE_PROJECT_llama.cpp_INCLUDE={include}"
    env = {**os.environ, "CMAKE_ARGS": cmake_args, "CMAKE_BUILD_PARALLEL_LEVEL": str(len(os.sched_getaffinity(0)))}
    _pip(python, "wheel", "-q", "--no-deps", str(sdist), "-w", str(folder), env=env)
    seconds = time.monotonic() - start
    print(f"built in {seconds:.0f} s", file=sys.stderr)
    wheel = sorted(folder.glob(f"llama_cpp_python-{version}-*.whl"))[0]
    facts = _target_facts(python)
    stamp = {"version": version, "sdist_sha256": pins["sdist_sha256"], "cmake_args": pins["cmake_args"],
             "recipe": recipe, "python": facts["python"], "machine": facts["machine"], "glibc": facts["glibc"],
             "wheel": wheel.name,
             "wheel_sha256": sha256(wheel), "build_s": round(seconds)}  # fmt: skip
    (folder / "build.json").write_text(json.dumps(stamp, indent=1) + "\n")
    return wheel


def _target_facts(python: str) -> dict[str, str]:
    """PY's Python, glibc and NumPy (what the converter needs and a prebuilt wheel must have been built for)."""
    code = ("import importlib.metadata as m, json, platform, sys\n"
            "try:\n    numpy = m.version('numpy')\nexcept m.PackageNotFoundError:\n    numpy = ''\n"
            "print(json.dumps({'python': '%d.%d' % sys.version_info[:2], 'glibc': platform.libc_ver()[1], "
            "'machine': platform.machine(), 'numpy': numpy}))")  # fmt: skip
    return dict(json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout))


def _release(text: str) -> tuple[int, ...]:
    match = re.match(r"\d+(?:\.\d+)*", text)
    return tuple(int(n) for n in match.group(0).split(".")) if match else ()


def carry_problem(converter: Path, facts: dict[str, str], version: str) -> str | None:
    """Why PY cannot run this llama.cpp's converter, from gguf-py's own requirements (Python, NumPy); None if it can.
    NumPy is never upgraded for it: an image's compiled packages are built against the base's."""
    meta = (converter / "gguf-py" / "pyproject.toml").read_text()
    python = re.search(r"requires-python\s*=\s*['\"]>=\s*([\d.]+)", meta)
    numpy = re.search(r"numpy\s*\(?>=\s*([\d.]+)", meta)
    tool = f"llama.cpp's converter (gguf-py, llama-cpp-python {version})"
    if python and _release(facts["python"]) < _release(python.group(1)):
        return f"{tool} needs Python >= {python.group(1)}; this Python is {facts['python']}"
    if numpy and _release(facts["numpy"] or "0") < _release(numpy.group(1)):
        return (f"{tool} needs numpy >= {numpy.group(1)}; this environment has numpy {facts['numpy'] or 'none'}, which "
                "its compiled packages are built against")  # fmt: skip
    return None


def _prebuilt(folder: Path | None, pins: dict, facts: dict[str, str]) -> tuple[Path | None, str]:
    """A wheel another build made (its build.json beside it), when it was built from these pins for this machine and
    glibc; else None and why not."""
    stamp_file = folder / "build.json" if folder else None
    if stamp_file is None or not stamp_file.is_file():
        return None, "no prebuilt wheel was given"
    stamp = json.loads(stamp_file.read_text())
    wanted = {"version": pins["version"], "sdist_sha256": pins["sdist_sha256"], "cmake_args": pins["cmake_args"],
              "recipe": build_recipe(pins["cmake_args"]), "machine": facts["machine"],
              "glibc": facts["glibc"]}  # fmt: skip
    differ = [f"{key} {stamp.get(key)!r}, not {value!r}" for key, value in wanted.items() if stamp.get(key) != value]
    if differ:
        return None, "the prebuilt wheel differs: " + "; ".join(differ)
    wheel = folder / stamp["wheel"]
    if not wheel.is_file() or sha256(wheel) != stamp["wheel_sha256"]:
        return None, f"the prebuilt wheel {stamp['wheel']} is missing or not the sha256 its build.json records"
    return wheel, f"the prebuilt wheel {stamp['wheel']} (sha256 {stamp['wheel_sha256']}) matches"


def _pins(from_env: bool) -> dict:
    if from_env:  # the image build's LLAMA_CPP_* build args (scripts/matrix.py's dockerfile_defaults)
        env = os.environ
        requires = env.get("LLAMA_CPP_REQUIRES", "").split()
        server = dict(word.rsplit(":", 1) for word in env.get("LLAMA_CPP_SERVER", "").split())
        return {"version": env["LLAMA_CPP_VERSION"], "sdist_sha256": env["LLAMA_CPP_SHA256"],
                "cmake_args": env.get("LLAMA_CPP_CMAKE_ARGS", ""), "requires": requires, "server": server}  # fmt: skip
    import tomllib

    table = dict(tomllib.loads((ROOT / "images" / "versions.toml").read_text())["llama_cpp"])
    return {**table, "server": dict(table.get("server", {}))}


def _install(python: str, wheel: Path, pins: dict) -> None:
    """The wheel with [llama_cpp]'s requires, and its server's requirements (hashed, [llama_cpp.server]): skipped where
    PY already imports that version and the server."""
    version = pins["version"]
    modules = ", ".join(name.split("==")[0] for name in pins["requires"])
    probe = [python, "-c", f"import llama_cpp, sys, {modules}, llama_cpp.server.app; "
             f"sys.exit(llama_cpp.__version__ != {version!r})"]  # fmt: skip
    if subprocess.run(probe, capture_output=True, check=False).returncode == 0:
        return
    _pip(python, "install", "-q", "--no-deps", str(wheel), *pins["requires"])
    if pins["server"]:
        with tempfile.TemporaryDirectory() as folder:  # the wheel's folder is read-only in the image build
            requirements = Path(folder) / "server-requirements.txt"
            requirements.write_text("".join(f"{name} --hash=sha256:{digest}\n" for name, digest in
                                            pins["server"].items()))  # fmt: skip
            _pip(python, "install", "-q", "--no-deps", "--require-hashes", "-r", str(requirements))
    server = subprocess.run([python, "-c", "import llama_cpp.server.app"], capture_output=True, text=True, check=False)
    if server.returncode != 0:
        print(f"setup_llama_cpp: llama.cpp's server cannot start in {python} (`serve` of a GGUF file refuses): "
              f"{server.stderr.strip().splitlines()[-1]}", file=sys.stderr)  # fmt: skip


def _write_claim(path: Path | None, claim: dict) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(claim, indent=2) + "\n")
    print(f"claim llama_cpp: {json.dumps(claim)}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the environment to install into (its python)")
    parser.add_argument("--cache", type=Path, default=None, help="the cache folder (default: %(default)s)")
    parser.add_argument("--pins-from-env", action="store_true", help="the pins from LLAMA_CPP_* (the image build)")
    parser.add_argument("--prebuilt", type=Path, help="a folder with a wheel and its build.json, taken when it matches")
    parser.add_argument("--no-install", action="store_true", help="build (or take) the wheel, install nothing")
    parser.add_argument("--claim", type=Path, help="write what was done (or why not) as a build-manifest claim")
    parser.add_argument("--converter-to", type=Path, help="also copy the converter folder here (the image)")
    args = parser.parse_args(argv)
    pins = _pins(args.pins_from_env)
    version = pins["version"]
    cache = (args.cache or default_cache()) / version
    sdist = _sdist(args.python, cache, version, pins["sdist_sha256"])
    _unpack_converter(sdist, cache / "llama.cpp", version)
    facts = _target_facts(args.python)
    problem = carry_problem(cache / "llama.cpp", facts, version)
    if problem:
        if args.claim is None:
            sys.exit(f"setup_llama_cpp: {problem}")
        shutil.rmtree(cache)  # nothing of it is used
        _write_claim(args.claim, {"status": "skipped", "reason": problem})
        return 0
    folder = wheel_folder(cache, pins["cmake_args"])
    wheel, why = _prebuilt(args.prebuilt, pins, facts)
    if (folder / "build.json").is_file():
        source = "the cache's wheel"
    elif wheel is not None and args.prebuilt is not None:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy2(wheel, folder / wheel.name)
        shutil.copy2(args.prebuilt / "build.json", folder / "build.json")
        source = f"taken, not compiled: {why}"
    else:
        source = ""
    start = time.monotonic()
    wheel = _wheel(args.python, sdist, folder, version, pins)
    stamp = json.loads((folder / "build.json").read_text())
    source = source or f"compiled from the sdist in {time.monotonic() - start:.0f} s ({why})"
    _write_claim(args.claim, {"status": "built", "version": version, "source": source, "wheel": wheel.name,
                              "wheel_sha256": stamp["wheel_sha256"], "cmake_args": pins["cmake_args"],
                              "sdist_sha256": pins["sdist_sha256"]})  # fmt: skip
    if not args.no_install:
        _install(args.python, wheel, pins)
    if args.converter_to is not None:
        shutil.copytree(cache / "llama.cpp", args.converter_to, dirs_exist_ok=True)
        print(args.converter_to)
        return 0
    print(cache / "llama.cpp")
    return 0


if __name__ == "__main__":
    sys.exit(main())
