"""Lay out a CUDA toolkit at CUDA_HOME from packages alone (runs inside the stand-in base build).

NVIDIA's PyPI wheels give ptxas, libnvvm, the headers, cudart and CCCL (`nvidia/<part>/{bin,include,lib,nvvm}`);
for CUDA 12 they lack the compiler driver (nvcc, cicc, cudafe++, fatbinary, nvlink), which comes from Debian's
repackaging of NVIDIA's binaries of the same release (`nvidia-cuda-toolkit`, non-free). CUDA 13 wheels hold all of it.

    python cuda_home.py fetch-debs DIR    apt-get downloads STANDIN_DEBS from STANDIN_DEB_SOURCE into DIR (run where
                                         apt has Debian's archive keys: the Debian root filesystem)
    python cuda_home.py                   lays out the toolkit: reads CUDA_HOME, STANDIN_WHEELS, STANDIN_DEBS,
                                         STANDIN_DEB_DIR (the fetched .debs), STANDIN_CACHE
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

CUDA_HOME = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
CACHE = Path(os.environ.get("STANDIN_CACHE", "/var/cache/trainkit-standin"))
WHEEL_PARTS = {"bin": "bin", "include": "include", "lib": "lib64", "nvvm": "nvvm"}
DEB_TOOLS = {  # path in the Debian package -> path under CUDA_HOME
    "usr/lib/nvidia-cuda-toolkit/bin/nvcc": "bin/nvcc",  # /usr/bin/nvcc is Debian's wrapper script
    "usr/lib/nvidia-cuda-toolkit/bin/cicc": "nvvm/bin/cicc",
    "usr/lib/nvidia-cuda-toolkit/bin/crt": "bin/crt",
    "usr/bin/cudafe++": "bin/cudafe++",
    "usr/bin/fatbinary": "bin/fatbinary",
    "usr/bin/nvlink": "bin/nvlink",
    "usr/bin/bin2c": "bin/bin2c",
    "usr/bin/cuobjdump": "bin/cuobjdump",
    "usr/bin/nvdisasm": "bin/nvdisasm",
    "usr/bin/nvprune": "bin/nvprune",
    "usr/bin/cu++filt": "bin/cu++filt",
}
NVCC_PROFILE = """\
TOP              = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
LD_LIBRARY_PATH += $(TOP)/lib64:
PATH            += $(TOP)/nvvm/bin:$(_HERE_):
INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)
LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib64/stubs" "-L$(TOP)/lib64"
CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
"""
# CUDA 13 keeps CCCL (thrust, cub, libcu++) in include/cccl; NVIDIA's own nvcc.profile adds it as a system include,
# so nvcc finds <thrust/...> while the host compiler alone does not (the same line, our layout has no targets/).
NVCC_PROFILE_CCCL = 'SYSTEM_INCLUDES +=  "-isystem" "$(TOP)/include/cccl" $(_SPACE_)\n'
PROBE = "__global__ void probe(float *x) { x[threadIdx.x] *= 2.0f; }\n"
CCCL_PROBE = """\
#include <thrust/complex.h>
#include <cub/cub.cuh>
__global__ void cccl_probe(float *x) { x[threadIdx.x] = thrust::abs(thrust::complex<float>(x[threadIdx.x], 1.0f)); }
"""


def run(argv: list[str], **kwargs) -> None:
    print("+", " ".join(argv), flush=True)
    subprocess.run(argv, check=True, **kwargs)


def fetch_wheels(requirements: list[str]) -> list[Path]:
    target = CACHE / "wheels"
    target.mkdir(parents=True, exist_ok=True)
    run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(target),
         *requirements])  # fmt: skip
    names = {r.split("==")[0].replace("-", "_").lower(): r.split("==")[1] for r in requirements}
    found = [w for w in target.glob("*.whl") if names.get(w.name.split("-")[0].lower()) == w.name.split("-")[1]]
    if len(found) != len(requirements):
        sys.exit(f"expected wheels for {requirements}, found {[w.name for w in found]}")
    return found


def fetch_debs(packages: list[str], source: str) -> list[Path]:
    """`apt-get download` pkg=version from `source` (a sources.list line), into the cache."""
    apt = CACHE / "apt"
    (apt / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (apt / "sources.list").write_text(source + "\n")
    options = [
        f"-oDir::Etc::sourcelist={apt}/sources.list", "-oDir::Etc::sourceparts=-",
        f"-oDir::State::Lists={apt}/lists", f"-oDir::Cache={apt}/cache", "-oAPT::Sandbox::User=root",
    ]  # fmt: skip
    debs = CACHE / "debs"
    debs.mkdir(exist_ok=True)
    wanted = [debs / f"{p.replace('=', '_').replace(':', '%3a')}_amd64.deb" for p in packages]
    if not all(d.is_file() for d in wanted):
        run(["apt-get", *options, "update"])
        run(["apt-get", *options, "download", *packages], cwd=debs)
    return wanted


def merge(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
    else:
        shutil.copy2(src, dst)


def install_wheel(wheel: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp)
        for part in sorted(Path(tmp, "nvidia").glob("*/")):
            for name, target in WHEEL_PARTS.items():
                if (part / name).is_dir():
                    merge(part / name, CUDA_HOME / target)
    for path in CUDA_HOME.rglob("*"):
        if path.is_file() and (path.parent.name == "bin" or path.suffix == ".so" or ".so." in path.name):
            path.chmod(0o755)  # zip archives drop the executable bit


def install_deb(deb: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run(["dpkg-deb", "-x", str(deb), tmp])
        for src, dst in DEB_TOOLS.items():
            if Path(tmp, src).exists():
                merge(Path(tmp, src), CUDA_HOME / dst)


def add_library_headers() -> None:
    """Headers of the CUDA libraries torch was installed with (cuBLAS, cuSPARSE, cuSOLVER, ...: its pip
    dependencies, `nvidia/<lib>/include`), where the toolkit lacks them: torch's ATen/cuda headers include them."""
    import site

    for root in site.getsitepackages():
        for include in sorted(Path(root, "nvidia").glob("*/include")):
            for header in include.rglob("*"):
                target = CUDA_HOME / "include" / header.relative_to(include)
                if header.is_file() and not target.exists():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(header, target)


def finish_layout() -> None:
    """Unversioned library links, the link-time libcuda stub, nvcc.profile, /usr/local/cuda."""
    lib64 = CUDA_HOME / "lib64"
    for lib in list(lib64.glob("*.so.*")):
        plain = lib64 / (lib.name.split(".so.")[0] + ".so")
        if not plain.exists():
            plain.symlink_to(lib.name)
    stubs = lib64 / "stubs"
    stubs.mkdir(exist_ok=True)
    # Link-time only (like the toolkit's own stub): the driver provides libcuda.so.1 at run time.
    stub = ["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stubs / "libcuda.so"), "-x", "c"]
    run([*stub, "/dev/null"])
    (CUDA_HOME / "bin" / "nvcc.profile").write_text(nvcc_profile())
    if Path("/usr/local/cuda") != CUDA_HOME and not Path("/usr/local/cuda").exists():
        Path("/usr/local/cuda").symlink_to(CUDA_HOME)


def nvcc_profile() -> str:
    """The stand-in's nvcc.profile: NVIDIA's, for this layout, with include/cccl where the toolkit has one (13+)."""
    return NVCC_PROFILE + (NVCC_PROFILE_CCCL if (CUDA_HOME / "include" / "cccl").is_dir() else "")


def prove_cccl(arch: str) -> None:
    """nvcc compiles thrust and cub includes for `arch`, as torch's headers and DeepSpeed's fused ops need."""
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "cccl_probe.cu").write_text(CCCL_PROBE)
        argv = [str(CUDA_HOME / "bin" / "nvcc"), "-c", f"-gencode=arch=compute_{arch},code=sm_{arch}",
                "-o", str(Path(tmp, "cccl_probe.o")), str(Path(tmp, "cccl_probe.cu"))]  # fmt: skip
        print("+", " ".join(argv), flush=True)
        result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(
            f"the stand-in toolkit's nvcc cannot compile #include <thrust/complex.h> and <cub/cub.cuh> for sm_{arch}:"
            f"\n{result.stderr.strip()}\n  CCCL's headers must be on nvcc's default include path: {CUDA_HOME}/include"
            f" (CUDA 12), or {CUDA_HOME}/include/cccl added by bin/nvcc.profile (CUDA 13)."
        )
    print(f"nvcc compiles thrust and cub for sm_{arch}", flush=True)


def prove(arch: str) -> None:
    """nvcc compiles a kernel to SASS for `arch` and cuobjdump finds it: the toolkit works."""
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "probe.cu").write_text(PROBE)
        obj = Path(tmp, "probe.o")
        run([str(CUDA_HOME / "bin" / "nvcc"), "--version"])
        run([str(CUDA_HOME / "bin" / "nvcc"), "-c", f"-gencode=arch=compute_{arch},code=sm_{arch}",
             "-o", str(obj), str(Path(tmp, "probe.cu"))])  # fmt: skip
        listing = subprocess.run([str(CUDA_HOME / "bin" / "cuobjdump"), "--list-elf", str(obj)],
                                 capture_output=True, text=True, check=True).stdout  # fmt: skip
        if f"sm_{arch}" not in listing:
            sys.exit(f"the stand-in toolkit did not produce sm_{arch} code: {listing}")
        print(listing, flush=True)


def copy_debs(packages: list[str], source: str, target: Path) -> None:
    """The fetched .debs of `packages`, copied out of the download cache into `target` (which may stay empty)."""
    target.mkdir(parents=True, exist_ok=True)
    for deb in fetch_debs(packages, source) if packages else []:
        shutil.copy2(deb, target / deb.name)


def main() -> None:
    if sys.argv[1:2] == ["fetch-debs"]:
        debs, source = os.environ.get("STANDIN_DEBS", "").split(), os.environ.get("STANDIN_DEB_SOURCE", "")
        copy_debs(debs, source, Path(sys.argv[2]))
        return
    wheels = os.environ.get("STANDIN_WHEELS", "").split()
    for wheel in fetch_wheels(wheels):
        install_wheel(wheel)
    for deb in sorted(Path(os.environ.get("STANDIN_DEB_DIR", "/nonexistent")).glob("*.deb")):
        install_deb(deb)
    add_library_headers()
    finish_layout()
    arch = os.environ.get("STANDIN_PROBE_ARCH", "90")
    prove(arch)
    prove_cccl(arch)


if __name__ == "__main__":
    main()
