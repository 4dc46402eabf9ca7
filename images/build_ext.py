"""Build steps run inside the image build (container side; no docker SDK).

Each step builds or keeps one piece and writes its claim to /wheels/claims/<piece>.json (a step of the runtime stage,
which cannot write there, to /opt/trainkit-build/claims/):
status "built" (compiled here), "kept" (the base already ships it working) or "skipped" (with the reason,
e.g. no CUDA on the CPU flavor). `manifest` merges the claims into /opt/trainkit/build-manifest.json and
images/verify.py proves them at the end of the build.

    python build_ext.py base-torch            record the base's torch version
    python build_ext.py deepspeed             wheel with the DeepSpeed ops prebuilt
    python build_ext.py flash-attn            keep NGC's, else a prebuilt wheel, else a source build
                                              (FLASH_ATTN_SKIP=reason: the row does not take it;
                                              FLASH_ATTN_SOURCE_BUILD=0: no source build, claim skipped)
    python build_ext.py apex                  keep NGC's, else build at the pinned ref
    python build_ext.py guard-torch           fail if torch differs from the base's
    python build_ext.py manifest              write the build manifest

Every file these steps download is checked against images/versions.toml's sha256 first (downloads.py).
"""

from __future__ import annotations

import ctypes.util
import glob
import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

from downloads import unhashed_refusal, verify_sha256

WHEELS = Path(os.environ.get("TRAINKIT_WHEELS", "/wheels"))
CLAIMS = WHEELS / "claims"
STATE = Path(os.environ.get("TRAINKIT_BUILD_STATE", "/opt/trainkit-build"))
BASE_TORCH_FILE = STATE / "base-torch.txt"
RUNTIME_CLAIMS = STATE / "claims"  # claims of the runtime stage's steps (scripts/setup_quant.py's llmcompressor)
MANIFEST = Path(os.environ.get("TRAINKIT_MANIFEST", "/opt/trainkit/build-manifest.json"))
SRC = Path("/tmp/trainkit-src")  # a fixed path, so ccache sees identical compile commands across builds
# flash-attn 2's SASS targets (its setup.py, FLASH_ATTN_CUDA_ARCHS): Ampere and newer, one per major.
FLASH_ATTN_SASS = (80, 90, 100, 110, 120)
GB_PER_FLASH_ATTN_THREAD = 5.0  # flash-attn's own estimate per nvcc thread
GB_PER_APEX_PROCESS = 4.0
MEMORY_SHARE = 0.8  # of the builder's memory; the rest stays for the OS, pip and the linker


def torch_facts() -> dict:
    import torch

    return {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }


def nvcc() -> str | None:
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    return shutil.which("nvcc") or next((p for p in [f"{cuda_home}/bin/nvcc"] if os.path.exists(p)), None)


def cuda_missing_reason(facts: dict | None = None) -> str | None:
    """Why CUDA extensions cannot be built here, or None when they can."""
    facts = facts or torch_facts()
    if facts["cuda"] is None:
        return f"torch {facts['version']} is a CPU build (torch.version.cuda is None)"
    if nvcc() is None:
        return "no nvcc in the base (CUDA_HOME/bin/nvcc missing)"
    return None


def has_libaio() -> bool:
    return ctypes.util.find_library("aio") is not None and os.path.exists("/usr/include/libaio.h")


def builder_resources() -> tuple[int, float]:
    """(cores, GB of memory) the build may use: MAX_JOBS caps the cores; a cgroup limit caps the memory."""
    cores = len(os.sched_getaffinity(0))
    if os.environ.get("MAX_JOBS", "").strip():
        cores = max(1, int(os.environ["MAX_JOBS"]))
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = Path("/sys/fs/cgroup/memory.max")
    if limit.is_file() and limit.read_text().strip().isdigit():
        mem = min(mem, int(limit.read_text()))
    return cores, mem / 2**30


def slots(cores: int, mem_gb: float, gb_each: float) -> int:
    """Compiler threads that fit: one per core, each with `gb_each` of the usable memory; at least one."""
    return max(1, min(cores, int(mem_gb * MEMORY_SHARE // gb_each)))


def max_jobs(per_job_gb: float) -> int:
    """Parallel compile jobs: MAX_JOBS if given, else what the builder's cores and memory allow."""
    return slots(*builder_resources(), per_job_gb)


def flash_attn_concurrency(cores: int, mem_gb: float, archs: int) -> tuple[int, int]:
    """(MAX_JOBS, NVCC_THREADS) for flash-attn: jobs x threads compiler threads, ~5 GB each, within both."""
    total = slots(cores, mem_gb, GB_PER_FLASH_ATTN_THREAD)
    threads = max(1, min(4, archs, total))  # nvcc --threads parallelises over archs only
    return max(1, total // threads), threads


def apex_concurrency(cores: int, mem_gb: float) -> tuple[int, int, int]:
    """(APEX_PARALLEL_BUILD, MAX_JOBS, nvcc --threads) for apex: their product stays within cores and memory.
    apex's README prefers parallel extensions over --threads when memory is short, so threads stay 1."""
    total = slots(cores, mem_gb, GB_PER_APEX_PROCESS)
    parallel = min(4, total)
    return parallel, max(1, total // parallel), 1


def flash_attn_archs(arch_list: str) -> str:
    """TORCH_CUDA_ARCH_LIST ("7.5 8.0 8.6 9.0+PTX") -> FLASH_ATTN_CUDA_ARCHS ("80;90"): per major the target
    flash-attn builds (its sm_80 code also runs on 8.6/8.9); archs before Ampere are dropped (FA2 needs 8.0+)."""
    wanted = {int(re.match(r"\d+", a).group(0)) * 10 for a in re.split(r"[;\s]+", arch_list.strip()) if a}
    return ";".join(str(sm) for sm in FLASH_ATTN_SASS if sm in wanted)


def compile_env(per_job_gb: float) -> dict[str, str]:
    env = dict(os.environ)
    if os.path.isdir("/usr/lib/ccache"):
        env["PATH"] = "/usr/lib/ccache:" + env["PATH"]
        env.setdefault("CCACHE_DIR", "/root/.ccache")
        env.update(CCACHE_BASEDIR=str(SRC), CCACHE_NOHASHDIR="1", CCACHE_COMPILERCHECK="content",
                   CCACHE_SLOPPINESS="include_file_ctime,include_file_mtime,time_macros")  # sources are unpacked anew
        if shutil.which("ccache") and nvcc():
            env["PYTORCH_NVCC"] = f"ccache {nvcc()}"
    stubs = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "lib64", "stubs")
    if stubs.is_dir():  # link-time libcuda (DeepSpeed's async_io links -lcuda); the driver provides it at run time
        env["LIBRARY_PATH"] = ":".join(filter(None, [env.get("LIBRARY_PATH"), str(stubs)]))
    env["MAX_JOBS"] = str(max_jobs(per_job_gb))
    # No debug info in the extensions (Python's own CFLAGS ask for -g; a later -g0 wins): nobody debugs an image's
    # kernels from it, it makes the layers bigger, and it costs compile time (measured on 2 cores: DeepSpeed's
    # cpu_adam_impl.cpp 34.3 CPU-s with -g against 25.0 without).
    env["CFLAGS"] = f"{env.get('CFLAGS', '')} -g0".strip()
    return env


def nodebug_compilers(env: dict[str, str]) -> dict[str, str]:
    """CC and CXX that end each command line with -g0. DeepSpeed's op builders put -g after every flag a build can
    give (their cxx_args come last), and debug info is about a third of their CPU compile (measured on 2 cores: an
    async_io source 42.9 CPU-s with -g, 28.4 without; the CPU flavor's ops about 550 CPU-s in all). Host compilers
    only: nvcc's host compiler is left as it is."""
    folder = SRC / "nodebug"
    folder.mkdir(parents=True, exist_ok=True)
    wrappers = {}
    for variable, compiler in (("CC", "gcc"), ("CXX", "g++")):
        wrapper = folder / compiler
        wrapper.write_text(f'#!/bin/sh\nexec {compiler} "$@" -g0\n')  # the compiler on PATH: ccache's, where found
        wrapper.chmod(0o755)
        wrappers[variable] = str(wrapper)
    return {**env, **wrappers}


def ccache_stats(env: dict[str, str]) -> None:
    if shutil.which("ccache"):
        subprocess.run(["ccache", "--show-stats"], env=env, check=False)


def run(argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None,
        timeout: float | None = None) -> None:
    print("+", " ".join(argv), flush=True)
    subprocess.run(argv, check=True, env=env, cwd=cwd, timeout=timeout)


def pip(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    run([sys.executable, "-m", "pip", *args], env=env, cwd=cwd)


def claim(piece: str, data: dict) -> None:
    CLAIMS.mkdir(parents=True, exist_ok=True)
    (CLAIMS / f"{piece}.json").write_text(json.dumps(data, indent=2))
    print(f"claim {piece}: {json.dumps(data)}", flush=True)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def find_sdist(folder: Path, name: str, version: str) -> Path:
    """The sdist of `name` `version` in `folder`, chosen by its file name, never by listing order."""
    for archive in sorted(folder.glob("*.tar.gz")):
        dist, _, found = archive.name.removesuffix(".tar.gz").rpartition("-")
        if canonical(dist) == canonical(name) and found == version:
            return archive
    present = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    sys.exit(f"no sdist of {name} {version} in {folder} after pip download (found: {present})")


def sdist_tree(name: str, version: str, src: Path = SRC) -> Path:
    """Download an sdist into its own folder and unpack it at a fixed path under `src`."""
    dl = src / "dl" / f"{canonical(name)}-{version}"  # one folder per piece: layers share `src`
    # No build isolation: an isolated metadata build would lack the base's torch (flash-attn's setup.py imports it).
    pip("download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation", "-d", str(dl), f"{name}=={version}")
    archive = find_sdist(dl, name, version)
    verify_sha256(archive)
    with tarfile.open(archive) as tar:
        top = {m.name.split("/")[0] for m in tar.getmembers()}
        try:
            tar.extractall(src, filter="data")
        except TypeError:  # Python without extraction filters (before 3.10.12)
            tar.extractall(src)
    return src / (top.pop() if len(top) == 1 else archive.name.removesuffix(".tar.gz"))


# -- steps ---------------------------------------------------------------------------------------------

def shipped_version(module: str, dist: str) -> str | None:
    """The version of a piece the base ships (None when it does not)."""
    if importlib.util.find_spec(module) is None:
        return None
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def step_base_torch() -> None:
    STATE.mkdir(parents=True, exist_ok=True)
    facts = torch_facts()
    facts["transformer_engine"] = shipped_version("transformer_engine", "transformer_engine")
    BASE_TORCH_FILE.write_text(facts["version"] + "\n")
    (STATE / "base-facts.json").write_text(json.dumps(facts))
    print(f"base torch {facts['version']} (cuda {facts['cuda']}, python {facts['python']})")


def step_deepspeed() -> None:
    version = os.environ["DEEPSPEED_VERSION"]
    no_cuda = cuda_missing_reason()
    ops: dict[str, dict] = {"cpu_adam": {"status": "built"}}
    ops["async_io"] = (
        {"status": "built"} if has_libaio() else {"status": "skipped", "reason": "libaio (libaio-dev) is missing"}
    )
    ops["fused_adam"] = {"status": "skipped", "reason": no_cuda} if no_cuda else {"status": "built"}
    # On CPUs every ZeRO run loads the shared-memory collectives op; unbuilt, each run JIT-compiles it (~90 s).
    ops["deepspeed_shm_comm"] = (
        {"status": "built"} if no_cuda else {"status": "skipped", "reason": "used by DeepSpeed's CPU accelerator only"}
    )
    env = compile_env(per_job_gb=2.0)
    env.update(DS_BUILD_OPS="0", DS_BUILD_STRING=f"+{env.get('TRAINKIT_FLAVOR', 'img')}")
    if no_cuda:
        env = nodebug_compilers(env)
        env["DS_ACCELERATOR"] = "cpu"
        if ops["async_io"]["status"] == "built":
            # DeepSpeed's CPU async_io build omits -laio (its .so then fails to load: undefined io_submit).
            env["LDFLAGS"] = (env.get("LDFLAGS", "") + " -Wl,--no-as-needed -laio").strip()
    else:
        env.update(cuda_deepspeed_env(ops["async_io"]["status"] == "built"))
        ops["pin_memory"] = dict(ops["async_io"])  # async_io loads the pin_memory op first: prebuild it too
    names = {
        "cpu_adam": "DS_BUILD_CPU_ADAM",
        "async_io": "DS_BUILD_AIO",
        "fused_adam": "DS_BUILD_FUSED_ADAM",
        "deepspeed_shm_comm": "DS_BUILD_SHM_COMM",
        "pin_memory": "DS_BUILD_PIN_MEMORY",
    }
    for op, flag in names.items():
        if op in ops:
            env[flag] = "1" if ops[op]["status"] == "built" else "0"
    tree = sdist_tree("deepspeed", version)
    ccache_stats(env)
    pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(WHEELS), str(tree), env=env, cwd=tree)
    ccache_stats(env)
    arch = {"arch_list": os.environ.get("TORCH_CUDA_ARCH_LIST", "")} if not no_cuda else {}
    claim("deepspeed", {"status": "built", "version": version, "ops": ops, **arch})


def cuda_deepspeed_env(with_aio: bool) -> dict[str, str]:
    """A build sees no GPU, so DeepSpeed would pick its CPU accelerator and compile CPU kernels (recording
    accelerator_name='cpu'; on a GPU every op would then be JIT-compiled). Name the CUDA accelerator, as DeepSpeed's
    own CPU-only precompile workflow does; ninja makes MAX_JOBS and `ccache nvcc` count."""
    env = {"DS_ACCELERATOR": "cuda", "DS_ENABLE_NINJA": "1"}
    if with_aio:
        # async_io links -lcuda although it calls no driver function: --as-needed drops that dependency, so the op
        # also loads where no driver is mounted (the build; CPU-only hosts).
        env["LDFLAGS"] = (os.environ.get("LDFLAGS", "") + " -Wl,--as-needed").strip()
    return env


def loads(*modules: str) -> str | None:
    """None if every module imports, else the first error."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:
            return f"import {name}: {type(exc).__name__}: {exc}"
    return None


def step_flash_attn() -> None:
    claim("flash_attn", provide_flash_attn(os.environ["FLASH_ATTN_VERSION"], torch_facts()))


def provide_flash_attn(version: str, facts: dict) -> dict:
    """Keep the base's, else install the prebuilt wheel, else build from source; return the claim."""
    row_skip = os.environ.get("FLASH_ATTN_SKIP", "").strip()  # versions.toml: this row does not take flash-attn
    if row_skip:
        base = shipped_version("flash_attn", "flash-attn")
        return {"status": "skipped", "reason": row_skip, "base_version": base}
    if facts["cuda"] is None:
        cpu = f"torch {facts['version']} is a CPU build (torch.version.cuda is None)"
        return {"status": "skipped", "reason": f"{cpu}: flash-attn's kernels need CUDA"}
    if loads("flash_attn", "flash_attn_2_cuda") is None:
        return {"status": "kept", "version": shipped_version("flash_attn", "flash-attn"), "source": "base image"}
    url = flash_attn_wheel_url(os.environ["FLASH_ATTN_WHEEL_URL"], version, facts)
    error = install_prebuilt_flash_attn(url)
    if error is None:
        return {"status": "built", "version": version, "source": url}
    why = f"no usable prebuilt wheel ({error})"
    if os.environ.get("FLASH_ATTN_SOURCE_BUILD", "1").strip() == "0":
        return {"status": "skipped", "reason": f"{why}, and source builds are off (FLASH_ATTN_SOURCE_BUILD=0)"}
    archs = flash_attn_archs(os.environ.get("TORCH_CUDA_ARCH_LIST", ""))
    no_build = cuda_missing_reason(facts) or ("" if archs else "the arch list has no Ampere or newer arch")
    if no_build:
        return {"status": "skipped", "reason": f"{why}, and no source build: {no_build}"}
    print(f"{why}; building flash-attn {version} from source for {archs}", flush=True)
    return build_flash_attn(version, archs)


def flash_attn_wheel_url(template: str, version: str, facts: dict) -> str:
    """The release wheel's URL for this torch (NGC's "2.7.0a0+7c8ec84dab.nv25.03" is torch 2.7)."""
    return template.format(
        version=version,
        cuda_major=facts["cuda"].split(".")[0],
        torch_mm=re.match(r"\d+\.\d+", facts["version"]).group(0),
        abi="TRUE" if facts["cxx11_abi"] else "FALSE",
        py=facts["python"].replace(".", ""),
    )


def install_prebuilt_flash_attn(url: str) -> str | None:
    """Install the wheel at `url` if its kernels load in this torch; None on success, else why not."""
    target = WHEELS / "prebuilt" / url.rsplit("/", 1)[-1]
    refusal = unhashed_refusal(target.name)
    if refusal:
        return f"{url} not downloaded: {refusal}"
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=60) as response, target.open("wb") as out:  # no endless hang offline
            shutil.copyfileobj(response, out)
        verify_sha256(target)  # a mismatch stops the build: SystemExit is not an Exception
        pip("install", "--no-deps", str(target))
    except Exception as exc:
        target.unlink(missing_ok=True)
        return f"{url}: {exc}"
    error = loads("flash_attn_2_cuda")
    if error:
        pip("uninstall", "-y", "flash-attn")
        target.unlink()
        return f"{url} does not load against this torch: {error}"
    shutil.move(target, WHEELS / target.name)
    return None


def build_flash_attn(version: str, archs: str) -> dict:
    jobs, threads = flash_attn_concurrency(*builder_resources(), archs=len(archs.split(";")))
    env = compile_env(per_job_gb=GB_PER_FLASH_ATTN_THREAD * threads)
    env.update(FLASH_ATTENTION_FORCE_BUILD="TRUE", FLASH_ATTN_CUDA_ARCHS=archs, MAX_JOBS=str(jobs),
               NVCC_THREADS=str(threads))  # fmt: skip
    tree = sdist_tree("flash_attn", version)
    pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(WHEELS), str(tree), env=env, cwd=tree)
    return {"status": "built", "version": version, "source": "source build", "archs": archs,
            "max_jobs": jobs, "nvcc_threads": threads}  # fmt: skip


def step_apex() -> None:
    ref = os.environ["APEX_REF"]
    no_cuda = cuda_missing_reason()
    if no_cuda:
        claim("apex", {"status": "skipped", "reason": f"{no_cuda}: apex's fused kernels need CUDA"})
        return
    if loads("apex", "amp_C", "fused_layer_norm_cuda") is None:
        claim("apex", {"status": "kept", "source": "base image"})
        return
    tree = SRC / "apex"
    repo = os.environ["APEX_REPO"]
    try:
        run(["git", "clone", "--filter=blob:none", repo, str(tree)], timeout=1800)
        run(["git", "checkout", "--quiet", ref], cwd=tree)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        reason = f"apex source not fetched from {repo} at {ref} ({exc}); set APEX_REPO to a reachable mirror"
        claim("apex", {"status": "skipped", "ref": ref, "reason": reason})
        return
    env = compile_env(per_job_gb=GB_PER_APEX_PROCESS)
    parallel, jobs, threads = apex_concurrency(*builder_resources())
    env.update(APEX_CPP_EXT="1", APEX_CUDA_EXT="1", APEX_PARALLEL_BUILD=str(parallel), MAX_JOBS=str(jobs),
               NVCC_APPEND_FLAGS=f"--threads {threads}")
    pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(WHEELS), str(tree), env=env, cwd=tree)
    claim("apex", {"status": "built", "ref": ref, "source": os.environ["APEX_REPO"]})


def step_guard_torch() -> None:
    expected = BASE_TORCH_FILE.read_text().strip()
    actual = torch_facts()["version"]
    if actual != expected:
        sys.exit(
            f"torch changed during the build: the base ships {expected}, now {actual}.\n"
            "A package pulled another torch; pin it to a version that accepts the base's torch "
            "(images/versions.toml), and keep the base's pip constraint file (PIP_CONSTRAINT) in place."
        )
    print(f"torch unchanged: {actual}")


def step_manifest() -> None:
    found = sorted([*CLAIMS.glob("*.json"), *RUNTIME_CLAIMS.glob("*.json")], key=lambda p: p.stem)
    claims = {p.stem: json.loads(p.read_text()) for p in found}
    pins = json.loads(os.environ.get("TRAINKIT_PINS", "{}"))
    base = json.loads((STATE / "base-facts.json").read_text())
    if base.get("transformer_engine"):  # the base's own piece: the build must leave it importable
        claims["transformer_engine"] = {"status": "kept", "version": base["transformer_engine"], "source": "base image"}
    manifest = {
        "flavor": os.environ.get("TRAINKIT_FLAVOR", "cuda"),
        "base": base,
        "pins": pins,
        "extensions": claims,
        "wheels": sorted(os.path.basename(p) for p in glob.glob(str(WHEELS / "*.whl"))),
    }
    MANIFEST.parent.mkdir(parents=True, exist_ok=True)
    MANIFEST.write_text(json.dumps(manifest, indent=2) + "\n")
    print(MANIFEST.read_text())


STEPS = {
    "base-torch": step_base_torch,
    "deepspeed": step_deepspeed,
    "flash-attn": step_flash_attn,
    "apex": step_apex,
    "guard-torch": step_guard_torch,
    "manifest": step_manifest,
}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in STEPS:
        sys.exit(f"usage: build_ext.py {{{'|'.join(STEPS)}}}")
    STEPS[sys.argv[1]]()
