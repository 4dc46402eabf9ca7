"""Build steps run inside the image build (container side; no docker SDK).

Each step builds or keeps one piece and writes its claim to /wheels/claims/<piece>.json:
status "built" (compiled here), "kept" (the base already ships it working) or "skipped" (with the reason,
e.g. no CUDA on the CPU flavor). `manifest` merges the claims into /opt/trainkit/build-manifest.json and
images/verify.py proves them at the end of the build.

    python build_ext.py base-torch            record the base's torch version
    python build_ext.py deepspeed             wheel with the DeepSpeed ops prebuilt
    python build_ext.py flash-attn            keep NGC's, else a prebuilt wheel, else a source build
    python build_ext.py apex                  keep NGC's, else build at the pinned ref
    python build_ext.py guard-torch           fail if torch differs from the base's
    python build_ext.py manifest              write the build manifest
"""

from __future__ import annotations

import ctypes.util
import glob
import importlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

WHEELS = Path(os.environ.get("TRAINKIT_WHEELS", "/wheels"))
CLAIMS = WHEELS / "claims"
STATE = Path("/opt/trainkit-build")
BASE_TORCH_FILE = STATE / "base-torch.txt"
MANIFEST = Path("/opt/trainkit/build-manifest.json")
SRC = Path("/tmp/trainkit-src")  # a fixed path, so ccache sees identical compile commands across builds


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


def cuda_missing_reason() -> str | None:
    """Why CUDA extensions cannot be built here, or None when they can."""
    facts = torch_facts()
    if facts["cuda"] is None:
        return f"torch {facts['version']} is a CPU build (torch.version.cuda is None)"
    if nvcc() is None:
        return "no nvcc in the base (CUDA_HOME/bin/nvcc missing)"
    return None


def has_libaio() -> bool:
    return ctypes.util.find_library("aio") is not None and os.path.exists("/usr/include/libaio.h")


def max_jobs(per_job_gb: float) -> int:
    """Parallel compile jobs: MAX_JOBS if given, else what the builder's cores and memory allow."""
    if os.environ.get("MAX_JOBS", "").strip():
        return max(1, int(os.environ["MAX_JOBS"]))
    cores = len(os.sched_getaffinity(0))
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return max(1, min(cores, int(mem_gb / per_job_gb)))


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
    return env


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


def sdist_tree(name: str, version: str) -> Path:
    """Download an sdist and unpack it at a fixed path under SRC."""
    dl = SRC / "dl"
    # No build isolation: an isolated metadata build would lack the base's torch (flash-attn's setup.py imports it).
    pip("download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation", "-d", str(dl), f"{name}=={version}")
    archive = next(p for p in dl.iterdir() if p.name.endswith(".tar.gz"))
    with tarfile.open(archive) as tar:
        try:
            tar.extractall(SRC, filter="data")
        except TypeError:  # Python without extraction filters (before 3.10.12)
            tar.extractall(SRC)
    return SRC / archive.name.removesuffix(".tar.gz")


# -- steps ---------------------------------------------------------------------------------------------

def step_base_torch() -> None:
    STATE.mkdir(parents=True, exist_ok=True)
    facts = torch_facts()
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
    version = os.environ["FLASH_ATTN_VERSION"]
    no_cuda = cuda_missing_reason()
    if no_cuda:
        claim("flash_attn", {"status": "skipped", "reason": f"{no_cuda}: flash-attn's kernels need CUDA"})
        return
    if loads("flash_attn", "flash_attn_2_cuda") is None:
        import flash_attn

        claim("flash_attn", {"status": "kept", "version": flash_attn.__version__, "source": "base image"})
        return
    if try_prebuilt_flash_attn(version):
        return
    if os.environ.get("TRAINKIT_STANDIN") and os.environ.get("FLASH_ATTN_FORCE_SOURCE") != "1":
        reason = ("stand-in base: no prebuilt wheel could be fetched, and a source build takes hours "
                  "(build arg FLASH_ATTN_FORCE_SOURCE=1 forces it)")
        claim("flash_attn", {"status": "skipped", "reason": reason})
        return
    env = compile_env(per_job_gb=6.0)  # flash-attn's kernels take several GB of RAM per nvcc job
    env["FLASH_ATTENTION_FORCE_BUILD"] = "TRUE"
    tree = sdist_tree("flash_attn", version)
    pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(WHEELS), str(tree), env=env, cwd=tree)
    claim("flash_attn", {"status": "built", "version": version, "source": "source build", "max_jobs": env["MAX_JOBS"]})


def try_prebuilt_flash_attn(version: str) -> bool:
    """Install the matching prebuilt wheel if one exists and its kernels load in this torch."""
    facts = torch_facts()
    url = os.environ["FLASH_ATTN_WHEEL_URL"].format(
        version=version,
        cuda_major=facts["cuda"].split(".")[0],
        torch_mm=".".join(facts["version"].split(".")[:2]),
        abi="TRUE" if facts["cxx11_abi"] else "FALSE",
        py=facts["python"].replace(".", ""),
    )
    target = WHEELS / "prebuilt" / url.rsplit("/", 1)[-1]
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        urllib.request.urlretrieve(url, target)
        pip("install", "--no-deps", str(target))
    except Exception as exc:
        print(f"no usable prebuilt flash-attn wheel ({url}): {exc}; building from source", flush=True)
        target.unlink(missing_ok=True)
        return False
    error = loads("flash_attn_2_cuda")
    if error:
        print(f"prebuilt flash-attn does not load against this torch ({error}); building from source", flush=True)
        pip("uninstall", "-y", "flash-attn")
        target.unlink()
        return False
    shutil.move(target, WHEELS / target.name)
    claim("flash_attn", {"status": "built", "version": version, "source": url})
    return True


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
    env = compile_env(per_job_gb=4.0)
    env.update(APEX_CPP_EXT="1", APEX_CUDA_EXT="1", APEX_PARALLEL_BUILD=env["MAX_JOBS"],
               NVCC_APPEND_FLAGS=f"--threads {env['MAX_JOBS']}")
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
    claims = {p.stem: json.loads(p.read_text()) for p in sorted(CLAIMS.glob("*.json"))}
    pins = json.loads(os.environ.get("TRAINKIT_PINS", "{}"))
    manifest = {
        "flavor": os.environ.get("TRAINKIT_FLAVOR", "cuda"),
        "base": json.loads((STATE / "base-facts.json").read_text()),
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
