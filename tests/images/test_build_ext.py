"""images/build_ext.py's decisions, run on the host: no image build, no GPU, no registry.

The steps are plain Python; tests point TRAINKIT_WHEELS (the build's /wheels) and TRAINKIT_BUILD_STATE at
temporary folders. What cannot be reached here stands in locally: PyPI as a find-links folder of small
sdists, the flash-attn release server as an HTTP server on 127.0.0.1, NGC's Transformer Engine as a package
that imports what TE 0.10 imports.
"""

from __future__ import annotations

import hashlib
import http.server
import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD_EXT = ROOT / "images" / "build_ext.py"
NGC_2503 = {"version": "2.7.0a0+7c8ec84dab.nv25.03", "cuda": "12.8", "cxx11_abi": True, "python": "3.12"}
URL_TEMPLATE = "{base}/v{{version}}/flash_attn-{{version}}+cu{{cuda_major}}torch{{torch_mm}}cxx11abi{{abi}}-cp{{py}}-cp{{py}}-linux_x86_64.whl"  # noqa: E501


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sys.path.insert(0, str(ROOT / "images"))  # build_ext imports downloads.py beside it, as in the image
build_ext = load_module(BUILD_EXT, "build_ext")
verify = load_module(ROOT / "images" / "verify.py", "verify")
sys.path.insert(0, str(ROOT / "scripts"))
import matrix  # noqa: E402


@pytest.fixture
def wheels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "wheels"
    monkeypatch.setattr(build_ext, "WHEELS", folder)
    monkeypatch.setattr(build_ext, "CLAIMS", folder / "claims")
    for var in ("FLASH_ATTN_SKIP", "FLASH_ATTN_SOURCE_BUILD", "MAX_JOBS", "ARTIFACT_SHA256", "TRAINKIT_ALLOW_UNHASHED"):
        monkeypatch.delenv(var, raising=False)
    for module in ("flash_attn", "flash_attn_2_cuda"):  # a fake base's, imported by an earlier test
        monkeypatch.delitem(sys.modules, module, raising=False)
    return folder


def record_sha256(monkeypatch: pytest.MonkeyPatch, files: dict[str, bytes]) -> None:
    """The ARTIFACT_SHA256 build arg, as scripts/matrix.py writes it, for these files' contents."""
    words = [f"{name}={hashlib.sha256(data).hexdigest()}" for name, data in files.items()]
    monkeypatch.setenv("ARTIFACT_SHA256", " ".join(words))


# -- defect 3: the sdist is chosen by name and version, in its own folder --------------------------------

def make_sdist(index: Path, name: str, version: str) -> Path:
    """A small installable sdist, as PyPI would serve it."""
    top = f"{name}-{version}"
    tree = index / "trees" / top
    tree.mkdir(parents=True)
    (tree / "setup.py").write_text(f"from setuptools import setup\nsetup(name={name!r}, version={version!r})\n")
    (tree / "WHICH").write_text(name)
    archive = index / f"{top}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tree, arcname=top)
    return archive


def test_find_sdist_picks_the_archive_by_name_and_version(tmp_path: Path) -> None:
    for name in ("deepspeed-0.19.8", "flash_attn-2.7.4.post1", "flash_attn-2.8.3.post2", "aaa-1.0"):
        (tmp_path / f"{name}.tar.gz").write_bytes(b"")
    assert build_ext.find_sdist(tmp_path, "flash-attn", "2.8.3.post2").name == "flash_attn-2.8.3.post2.tar.gz"
    assert build_ext.find_sdist(tmp_path, "DeepSpeed", "0.19.8").name == "deepspeed-0.19.8.tar.gz"
    with pytest.raises(SystemExit, match=r"no sdist of flash_attn 2\.9\.0"):
        build_ext.find_sdist(tmp_path, "flash_attn", "2.9.0")


def test_each_piece_downloads_into_its_own_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The DeepSpeed layer's archive (and any leftover) never becomes flash-attn's source tree."""
    index = tmp_path / "index"
    index.mkdir()
    archives = [make_sdist(index, "deepspeed", "0.19.8"), make_sdist(index, "flash_attn", "2.8.3.post2")]
    record_sha256(monkeypatch, {a.name: a.read_bytes() for a in archives})
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # PyPI stands in as a local folder
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    src = tmp_path / "src"
    shared = src / "dl"  # where every piece used to download
    shared.mkdir(parents=True)
    for n in range(20):  # leftovers that a "first .tar.gz listed" choice would pick
        (shared / f"leftover{n}-1.0.tar.gz").write_bytes(b"")

    deepspeed = build_ext.sdist_tree("deepspeed", "0.19.8", src=src)
    flash = build_ext.sdist_tree("flash_attn", "2.8.3.post2", src=src)

    assert (deepspeed / "WHICH").read_text() == "deepspeed"
    assert (flash / "WHICH").read_text() == "flash_attn"
    assert flash == src / "flash_attn-2.8.3.post2"
    assert [p.name for p in (src / "dl" / "flash-attn-2.8.3.post2").iterdir()] == ["flash_attn-2.8.3.post2.tar.gz"]


# -- defect 5: concurrency sized from cores and memory ---------------------------------------------------

@pytest.mark.parametrize(("cores", "mem_gb"), [(2, 24), (64, 512), (16, 32), (1, 4), (128, 64)])
def test_concurrency_fits_cores_and_memory(cores: int, mem_gb: float) -> None:
    usable = mem_gb * build_ext.MEMORY_SHARE
    for archs in (1, 2, 6):
        jobs, threads = build_ext.flash_attn_concurrency(cores, mem_gb, archs)
        assert jobs >= 1 and 1 <= threads <= max(1, min(4, archs))
        assert jobs * threads <= cores
        if usable >= build_ext.GB_PER_FLASH_ATTN_THREAD:  # below one job's need, one job is all there is
            assert jobs * threads * build_ext.GB_PER_FLASH_ATTN_THREAD <= usable
    parallel, jobs, threads = build_ext.apex_concurrency(cores, mem_gb)
    assert min(parallel, jobs, threads) >= 1
    assert parallel * jobs * threads <= cores
    if usable >= build_ext.GB_PER_APEX_PROCESS:
        assert parallel * jobs * threads * build_ext.GB_PER_APEX_PROCESS <= usable


def test_concurrency_on_this_project_machine_and_a_large_builder() -> None:
    assert build_ext.flash_attn_concurrency(2, 24, archs=1) == (2, 1)  # CI: one arch, two single-thread jobs
    assert build_ext.flash_attn_concurrency(2, 24, archs=6) == (1, 2)
    assert build_ext.flash_attn_concurrency(64, 512, archs=6) == (16, 4)  # 64 threads, 320 GB
    assert build_ext.apex_concurrency(2, 24) == (2, 1, 1)
    assert build_ext.apex_concurrency(64, 512) == (4, 16, 1)  # was 64 x 64 x 64 compiler threads


def test_max_jobs_caps_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAX_JOBS", "3")
    assert build_ext.builder_resources()[0] == 3


@pytest.mark.parametrize(
    ("arch_list", "archs"),
    [
        ("7.5 8.0 8.6 9.0 10.0 12.0+PTX", "80;90;100;120"),
        ("8.0 8.6 9.0 10.0 11.0 12.0+PTX", "80;90;100;110;120"),
        ("5.2 6.0 6.1 7.0 7.5 8.0 8.6 9.0+PTX", "80;90"),
        ("9.0", "90"),
        ("8.6;8.9", "80"),
        ("9.0a 10.0a", "90;100"),
        ("7.0 7.5", ""),
    ],
)
def test_flash_attn_archs_follow_the_arch_list(arch_list: str, archs: str) -> None:
    assert build_ext.flash_attn_archs(arch_list) == archs


# -- defect 5: the flash-attn choice, its wheel URL and its fallback -------------------------------------

def test_wheel_url_for_ngc_torch_facts() -> None:
    template = "https://x/v{version}/flash_attn-{version}+cu{cuda_major}torch{torch_mm}cxx11abi{abi}-cp{py}.whl"
    url = build_ext.flash_attn_wheel_url(template, "2.8.3.post2", NGC_2503)
    assert url == "https://x/v2.8.3.post2/flash_attn-2.8.3.post2+cu12torch2.7cxx11abiTRUE-cp312.whl"
    old = {"version": "2.1.0a0+b5021ba", "cuda": "12.1", "cxx11_abi": False, "python": "3.10"}
    assert build_ext.flash_attn_wheel_url(template, "2.7.4", old).endswith("+cu12torch2.1cxx11abiFALSE-cp310.whl")


class Server(http.server.ThreadingHTTPServer):
    files: dict[str, bytes]
    requests: list[str]


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.requests.append(self.path)
        body = self.server.files.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write(body or b"not found")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def release_server() -> Iterator[Server]:
    """A stand-in for the flash-attn release downloads, on 127.0.0.1."""
    server = Server(("127.0.0.1", 0), Handler)
    server.files, server.requests = {}, []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


WHEEL = "flash_attn-2.8.3.post2+cu12torch2.7cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"


def use_server(monkeypatch: pytest.MonkeyPatch, server: Server, served: bytes = b"") -> str:
    """The release URL template pointed at `server`, and the sha256 of what it serves recorded for the wheel."""
    base = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("FLASH_ATTN_WHEEL_URL", URL_TEMPLATE.format(base=base))
    record_sha256(monkeypatch, {WHEEL: served})
    path = f"/v2.8.3.post2/{WHEEL}"
    if served:
        server.files[path] = served
    return path


def test_missing_wheel_without_source_builds_is_a_skip_with_the_reason(
    wheels: Path, release_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = use_server(monkeypatch, release_server)
    monkeypatch.setenv("FLASH_ATTN_SOURCE_BUILD", "0")
    claim = build_ext.provide_flash_attn("2.8.3.post2", NGC_2503)
    assert release_server.requests == [path]  # the URL formed from NGC's torch facts was asked for
    assert claim["status"] == "skipped"
    assert "404" in claim["reason"] and path in claim["reason"]
    assert "FLASH_ATTN_SOURCE_BUILD=0" in claim["reason"]


def test_unreachable_release_server_is_a_skip_with_the_reason(wheels: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a builder without GitHub access: the refused connection is named, nothing waits forever."""
    monkeypatch.setenv("FLASH_ATTN_WHEEL_URL", URL_TEMPLATE.format(base="http://127.0.0.1:9"))
    monkeypatch.setenv("FLASH_ATTN_SOURCE_BUILD", "0")
    record_sha256(monkeypatch, {WHEEL: b"the wheel"})
    claim = build_ext.provide_flash_attn("2.8.3.post2", NGC_2503)
    assert claim["status"] == "skipped" and "http://127.0.0.1:9/v2.8.3.post2/" in claim["reason"]
    assert "refused" in claim["reason"].lower()


def test_unusable_wheel_falls_back_and_leaves_nothing_behind(
    wheels: Path, release_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = use_server(monkeypatch, release_server, served=b"this is not a wheel")
    monkeypatch.setenv("FLASH_ATTN_SOURCE_BUILD", "0")
    claim = build_ext.provide_flash_attn("2.8.3.post2", NGC_2503)
    assert release_server.requests == [path]
    assert claim["status"] == "skipped" and "no usable prebuilt wheel" in claim["reason"]
    assert not list(wheels.rglob("*.whl")), "a wheel that failed to install was kept for the image"


def test_source_build_needs_nvcc_and_an_ampere_arch(
    wheels: Path, release_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Source builds on (the default): without nvcc here the claim says so instead of failing later."""
    use_server(monkeypatch, release_server)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    monkeypatch.setenv("CUDA_HOME", str(wheels / "no-cuda"))
    (wheels / "empty-bin").mkdir(parents=True)
    monkeypatch.setenv("PATH", str(wheels / "empty-bin"))  # no nvcc anywhere, even on a host that has one
    claim = build_ext.provide_flash_attn("2.8.3.post2", NGC_2503)
    assert claim["status"] == "skipped" and "no nvcc" in claim["reason"]
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "7.0 7.5")
    nvcc = wheels / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(wheels / "cuda"))
    claim = build_ext.provide_flash_attn("2.8.3.post2", NGC_2503)
    assert claim["status"] == "skipped" and "no Ampere or newer arch" in claim["reason"]


def test_row_skip_and_cpu_torch_are_recorded_with_their_reason(wheels: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLASH_ATTN_SKIP", "flash-attn 2 needs torch >= 2.2")
    claim = build_ext.provide_flash_attn("2.8.3.post2", NGC_2503)
    assert claim == {"status": "skipped", "reason": "flash-attn 2 needs torch >= 2.2", "base_version": None}
    monkeypatch.delenv("FLASH_ATTN_SKIP")
    cpu = {**NGC_2503, "version": "2.13.0+cpu", "cuda": None}
    claim = build_ext.provide_flash_attn("2.8.3.post2", cpu)
    assert claim["status"] == "skipped" and "CPU build" in claim["reason"]


def fake_package(root: Path, name: str, version: str, files: dict[str, str]) -> None:
    """An installed package as NGC's base would hold it: modules plus its dist-info."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_working_flash_attn_in_the_base_is_kept(
    wheels: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    fake_package(site, "flash_attn", "2.7.3", {"flash_attn/__init__.py": "", "flash_attn_2_cuda.py": ""})
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("FLASH_ATTN_WHEEL_URL", "http://127.0.0.1:9/never-asked")
    claim = build_ext.provide_flash_attn("2.8.3.post2", NGC_2503)
    assert claim == {"status": "kept", "version": "2.7.3", "source": "base image"}


def test_flash_attn_step_writes_its_claim(tmp_path: Path) -> None:
    """The step as the Dockerfile runs it, on this host's CPU torch."""
    env = {**os.environ, "TRAINKIT_WHEELS": str(tmp_path), "FLASH_ATTN_VERSION": "2.8.3.post2",
           "FLASH_ATTN_WHEEL_URL": "http://127.0.0.1:9/x.whl"}  # fmt: skip
    subprocess.run([sys.executable, str(BUILD_EXT), "flash-attn"], env=env, check=True, capture_output=True)
    claim = json.loads((tmp_path / "claims" / "flash_attn.json").read_text())
    assert claim["status"] == "skipped" and "CPU build" in claim["reason"]


# -- defect 4: the base's Transformer Engine must still import after the build ---------------------------

TE_0_10 = {  # what matters of Transformer Engine 0.10: its PyTorch side imports flash-attn 1's API
    "transformer_engine/__init__.py": "",
    "transformer_engine/pytorch/__init__.py": "from flash_attn.flash_attn_interface import flash_attn_unpadded_func\n",
}


def run_step(step: str, env: dict[str, str]) -> None:
    proc = subprocess.run([sys.executable, str(BUILD_EXT), step], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def te_manifest(tmp_path: Path, site: Path) -> tuple[dict, dict[str, str]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "TRAINKIT_WHEELS": str(tmp_path / "wheels"), "TRAINKIT_BUILD_STATE": str(tmp_path / "state"),
           "TRAINKIT_MANIFEST": str(tmp_path / "manifest.json")}  # fmt: skip
    run_step("base-torch", env)
    run_step("manifest", env)
    return json.loads((tmp_path / "manifest.json").read_text()), env


def run_check(manifest: dict, name: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
    check = next(c for n, c, _ in verify.planned_checks(manifest) if n == name)
    return check()


def test_a_build_that_breaks_transformer_engine_fails_verify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    fake_package(site, "transformer_engine", "0.10.0", TE_0_10)
    manifest, env = te_manifest(tmp_path, site)
    assert manifest["base"]["transformer_engine"] == "0.10.0"
    assert manifest["extensions"]["transformer_engine"] == {"status": "kept", "version": "0.10.0",
                                                            "source": "base image"}  # fmt: skip
    # Without flash-attn 1 (a build that replaced it): verify names the broken import.
    with pytest.raises(verify.Failed, match=r"transformer_engine\.pytorch.*flash_attn"):
        run_check(manifest, "transformer_engine", env, monkeypatch)
    # With the base's flash-attn 1 kept, the same check passes.
    fa1 = {"flash_attn/__init__.py": "", "flash_attn/flash_attn_interface.py": "flash_attn_unpadded_func = 1\n"}
    fake_package(site, "flash_attn", "1.0.7", fa1)
    assert run_check(manifest, "transformer_engine", env, monkeypatch) == "loads transformer_engine.pytorch"


def test_no_transformer_engine_claim_where_the_base_lacks_it(tmp_path: Path) -> None:
    manifest, _ = te_manifest(tmp_path, tmp_path / "empty-site")
    assert manifest["base"]["transformer_engine"] is None
    assert "transformer_engine" not in manifest["extensions"]


# -- issue 26, item 14: every download is checked against images/versions.toml's sha256 ------------------

def test_an_sdist_that_is_not_the_recorded_one_fails_the_step_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DeepSpeed 0.19.8 sdist that differs from the one hashed in versions.toml (here: a small real archive under
    that name, as a tampering mirror would serve it) stops the build before it is unpacked."""
    index = tmp_path / "index"
    index.mkdir()
    archive = make_sdist(index, "deepspeed", "0.19.8")
    recorded = matrix.dockerfile_defaults()["ARTIFACT_SHA256"]  # the build arg the Dockerfile gets
    assert "deepspeed-0.19.8.tar.gz=9e491abd" in recorded
    monkeypatch.setenv("ARTIFACT_SHA256", recorded)
    monkeypatch.delenv("TRAINKIT_ALLOW_UNHASHED", raising=False)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    src = tmp_path / "src"
    with pytest.raises(SystemExit, match=r"sha256 mismatch for deepspeed-0\.19\.8\.tar\.gz: images/versions\.toml "
                                         r"records 9e491abd\w+, the download \(.+\) is "
                                         + hashlib.sha256(archive.read_bytes()).hexdigest()):  # fmt: skip
        build_ext.sdist_tree("deepspeed", "0.19.8", src=src)
    assert not (src / "deepspeed-0.19.8").exists(), "a rejected download was unpacked"
    # the same step as a process, as the Dockerfile runs it: exit non-zero with the message
    check = subprocess.run([sys.executable, str(ROOT / "images" / "downloads.py"), str(archive)],
                           capture_output=True, text=True, env={**os.environ, "ARTIFACT_SHA256": recorded})  # fmt: skip
    assert check.returncode == 1 and "sha256 mismatch for deepspeed-0.19.8.tar.gz" in check.stderr
    record_sha256(monkeypatch, {archive.name: archive.read_bytes()})  # the hash of this very file: accepted
    assert (build_ext.sdist_tree("deepspeed", "0.19.8", src=src) / "WHICH").read_text() == "deepspeed"


def test_a_download_without_a_recorded_sha256_is_refused_unless_allowed(
    wheels: Path, tmp_path: Path, release_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "deepspeed-0.19.8.tar.gz"
    file.write_bytes(b"any bytes")
    monkeypatch.setenv("ARTIFACT_SHA256", matrix.dockerfile_defaults()["ARTIFACT_SHA256"])
    unknown = tmp_path / "other-1.0.tar.gz"
    unknown.write_bytes(b"any bytes")
    with pytest.raises(SystemExit, match=r"no sha256 recorded for other-1\.0\.tar\.gz .*--allow-unhashed"):
        build_ext.verify_sha256(unknown)
    # the flash-attn release wheels have no recorded hash (GitHub was not reachable): not even downloaded
    path = use_server(monkeypatch, release_server, served=b"a wheel nobody hashed")
    monkeypatch.setenv("ARTIFACT_SHA256", matrix.dockerfile_defaults()["ARTIFACT_SHA256"])
    monkeypatch.setenv("FLASH_ATTN_SOURCE_BUILD", "0")
    claim = build_ext.provide_flash_attn("2.8.3.post2", NGC_2503)
    assert release_server.requests == []
    assert claim["status"] == "skipped" and f"no sha256 recorded for {WHEEL}" in claim["reason"]
    monkeypatch.setenv("TRAINKIT_ALLOW_UNHASHED", "1")  # build.py --allow-unhashed
    build_ext.verify_sha256(unknown)
    build_ext.provide_flash_attn("2.8.3.post2", NGC_2503)
    assert release_server.requests == [path]


def test_a_wheel_that_differs_from_its_recorded_sha256_stops_the_build(
    wheels: Path, release_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mismatch is not a missing wheel: no quiet fallback to a source build, the build fails naming the file."""
    path = use_server(monkeypatch, release_server, served=b"the wheel as released")
    release_server.files[path] = b"the wheel as a mirror changed it"
    with pytest.raises(SystemExit, match=f"sha256 mismatch for {re.escape(WHEEL)}"):
        build_ext.provide_flash_attn("2.8.3.post2", NGC_2503)
    assert not list(wheels.rglob("*.whl")) or not (wheels / WHEEL).exists()
