"""versions.toml, matrix.py and build.py's plan: no Docker engine needed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "scripts" / "build.py"
VERSIONS = tomllib.loads((ROOT / "images" / "versions.toml").read_text())
CUDAS = list(VERSIONS["cuda"])

sys.path.insert(0, str(ROOT / "scripts"))
import gpu_generations  # noqa: E402
import matrix  # noqa: E402


def build_py(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BUILD), *args], capture_output=True, text=True, timeout=60,
                          env=env, cwd=ROOT)  # fmt: skip


@pytest.mark.parametrize("cuda", CUDAS)
def test_dry_run_prints_the_resolved_plan(cuda: str) -> None:
    entry = VERSIONS["cuda"][cuda]
    # No engine at all: DOCKER_HOST points nowhere, the dry run must not care.
    proc = build_py("--cuda", cuda, "--dry-run", env={**os.environ, "DOCKER_HOST": "tcp://127.0.0.1:9"})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    xy = cuda.replace(".", "")
    assert f"nvcr.io/nvidia/pytorch:{entry['ngc']}-py3" in out
    assert f"torch:   {entry['torch']}" in out
    assert f"python:  {entry['python']}" in out
    assert entry["arch_list"] in out
    assert f"trainkit:{VERSIONS['version']}-cu{xy}-ngc{entry['ngc']}" in out
    assert f"trainkit:latest-cu{xy}" in out
    pins = {**VERSIONS["packages"], **entry.get("packages", {})}
    for package, version in pins.items():
        if package in entry.get("skip", {}):  # not built: no pin claimed
            assert f"{package}==" not in out
        else:
            assert f"{package}=={version}" in out


def test_cuda_12_1_resolves_to_an_ngc_23_release() -> None:
    proc = build_py("--cuda", "12.1", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"nvcr\.io/nvidia/pytorch:23\.\d\d-py3", proc.stdout)


def test_all_dry_run_covers_the_matrix() -> None:
    proc = build_py("--all", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("plan: trainkit") == len(CUDAS) + 1  # and the online-RL row
    for cuda, entry in VERSIONS["cuda"].items():
        assert f"plan: trainkit 0.1.0, CUDA {cuda}\n  base:    nvcr.io/nvidia/pytorch:{entry['ngc']}-py3" in proc.stdout
    assert f"  base:    {VERSIONS['vllm']['server_image']} (NGC vLLM 26.10)" in proc.stdout


@pytest.mark.parametrize(("cuda", "ngc", "torch"), [("13.1", "25.12", "2.10.0a0+b4e4ee81d3"), ("13.2", "26.03", "2.11"),
                                                    ("13.3", "26.07", "2.13.0a0+9186a08")])  # fmt: skip
def test_the_13_x_rows_follow_the_reference_table(cuda: str, ngc: str, torch: str) -> None:
    """NGC 25.12-26.07 as ../shared/reference/ngc-pytorch-releases.tsv gives them; weaker facts marked unverified
    (the build's base check then fails the first real build on any difference), floors at R580."""
    entry = VERSIONS["cuda"][cuda]
    assert entry["ngc"] == ngc and entry["torch"].startswith(torch) and entry["python"] == "3.12"
    assert entry["verified"] is False and entry["note"]
    assert entry["driver_min"] == "580.65.06"
    assert "unsupported" not in entry  # what a row cannot run is derived from its stack, not written


def test_every_13_x_row_needs_r580_and_the_default_stays_on_r570() -> None:
    floors = {cuda: e["driver_min"] for cuda, e in VERSIONS["cuda"].items()}
    assert all(floor.split(".")[0] == "580" for cuda, floor in floors.items() if cuda.startswith("13."))
    assert VERSIONS["default_cuda"] == "12.8" and floors["12.8"].startswith("570.")


def test_the_online_rl_row_plans_the_trainer_on_nvidias_vllm_image() -> None:
    proc = build_py("--rl", "--dry-run", env={**os.environ, "DOCKER_HOST": "tcp://127.0.0.1:9"})
    assert proc.returncode == 0, proc.stderr
    rl, out = VERSIONS["rl"], proc.stdout
    assert "plan: trainkit 0.1.0, online RL, CUDA 13.4 (NVIDIA's vLLM image)" in out
    assert "base:    nvcr.io/nvidia/vllm:26.10-py3 (NGC vLLM 26.10)" in out
    assert f"torch:   {rl['torch']} (kept from the base)" in out
    assert "transformers==5.17.0" in out and "huggingface-hub==1.33.0" in out and "trl==1.16.0" in out
    assert "tags:    trainkit:0.1.0-rl-cu134-vllm26.10, trainkit:latest-rl" in out
    assert "TRAIN_RL_ENGINE=vllm accepted: colocate and server mode (vLLM 0.31.0" in out
    assert "pulled by tag: no digest" in out  # none recorded yet: no pull from this machine
    # as docs/images.md says: the row's torch is above llmcompressor's range (its label, the build's, will agree)
    assert (f"fp8/w4a16: export --quant refused: torch {rl['torch']} is outside llmcompressor 0.14.0.1's "
            "torch<=2.14.0,>=2.10.0") in out  # fmt: skip


def test_the_online_rl_row_is_pinned_by_its_digest_once_one_is_recorded(tmp_path: Path) -> None:
    text = (ROOT / "images" / "versions.toml").read_text().replace('server_digest = ""',
                                                                   'server_digest = "sha256:' + "ab" * 32 + '"')
    changed = tmp_path / "versions.toml"
    changed.write_text(text)
    rl = matrix.load(changed).rl
    assert rl.base_ref == "nvcr.io/nvidia/vllm:26.10-py3@sha256:" + "ab" * 32
    plan_env = {**os.environ, "DOCKER_HOST": "tcp://127.0.0.1:9"}
    assert "@sha256" not in build_py("--rl", "--dry-run", env=plan_env).stdout.split("tags:")[0]


def test_require_digest_refuses_the_online_rl_row_until_its_digest_is_recorded() -> None:
    proc = build_py("--rl", "--require-digest", "--dry-run")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--require-digest: nvcr.io/nvidia/vllm:26.10-py3 has no digest in images/versions.toml's [vllm] " \
           "server_digest" in proc.stderr  # fmt: skip


@pytest.mark.parametrize("other", [["--ngc", "26.07"], ["--base", "x:y"]])
def test_the_online_rl_row_refuses_another_base(other: list[str]) -> None:
    proc = build_py("--rl", *other, "--dry-run")
    assert proc.returncode == 2 and "[vllm]'s server_image" in proc.stderr and "Traceback" not in proc.stderr


def test_a_cuda_row_without_a_vllm_for_its_torch_refuses_the_engine_and_says_why() -> None:
    proc = build_py("--cuda", "13.1", "--dry-run")
    assert "TRAIN_RL_ENGINE=vllm refused: the CUDA 13.1 row (torch 2.10.0a0+b4e4ee81d3.nv25.12)" in proc.stdout


def test_unknown_cuda_exits_2_listing_the_supported_ones() -> None:
    proc = build_py("--cuda", "11.8", "--dry-run")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "11.8" in proc.stderr
    for cuda in CUDAS:
        assert cuda in proc.stderr


def test_bad_ngc_and_ca_cert_are_user_errors(tmp_path: Path) -> None:
    proc = build_py("--cuda", "12.8", "--ngc", "2503", "--dry-run")
    assert proc.returncode == 2 and "YY.MM" in proc.stderr and "Traceback" not in proc.stderr
    not_pem = tmp_path / "ca.txt"
    not_pem.write_text("hello")
    env = {**os.environ, "DOCKER_HOST": "tcp://127.0.0.1:9", "TRAINKIT_CA_CERT": str(not_pem)}
    proc = build_py("--cpu", env=env)
    assert proc.returncode == 2 and "TRAINKIT_CA_CERT" in proc.stderr and "Traceback" not in proc.stderr


def test_unreachable_engine_is_one_clear_message() -> None:
    proc = build_py("--cpu", env={**os.environ, "DOCKER_HOST": "tcp://127.0.0.1:9"})
    assert proc.returncode == 2
    assert "cannot reach the Docker Engine" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_ngc_override_keeps_the_entry_pins_and_names_the_base_in_the_tag() -> None:
    proc = build_py("--cuda", "12.8", "--ngc", "25.02", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "nvcr.io/nvidia/pytorch:25.02-py3" in proc.stdout
    assert "trainkit:0.1.0-cu128-ngc25.02" in proc.stdout
    assert "not in the matrix" in proc.stdout


def test_tags_and_default_images() -> None:
    m = matrix.load()
    assert matrix.cpu_tags(m) == [f"trainkit:{m.version}-cpu", "trainkit:latest-cpu"]
    assert matrix.cpu_tags(m, "reg.example/me")[0] == f"reg.example/me/trainkit:{m.version}-cpu"
    assert matrix.default_image(gpu=False) == "trainkit:latest-cpu"
    assert matrix.default_image(gpu=True) == f"trainkit:latest-cu{m.default_cuda.replace('.', '')}"
    assert m.default_cuda in m.entries


def test_every_entry_is_complete() -> None:
    rl = VERSIONS["rl"]
    assert rl["cuda_full"].startswith(rl["cuda"] + ".") and rl["vllm"] and rl["torch"] and rl["driver_min"]
    for cuda, entry in VERSIONS["cuda"].items():
        assert re.fullmatch(r"\d\d\.\d\d", entry["ngc"]), cuda
        assert entry["cuda_full"].startswith(cuda + "."), cuda
        assert {"apex", "flash_attn", "transformer_engine"} <= set(entry["includes"]), cuda
        for key in ("torch", "python", "ubuntu", "driver_min", "arch_list"):
            assert entry[key], (cuda, key)


def test_images_doc_shows_the_matrix_table() -> None:
    # The drift check over every generated file (this one included) is tests/test_generated.py's.
    assert matrix.readme_table() in (ROOT / "docs" / "images.md").read_text()


def test_hadolint_passes_on_the_dockerfiles() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    for dockerfile in (ROOT / "Dockerfile", ROOT / "images" / "cpu-base" / "Dockerfile"):
        proc = subprocess.run([str(hadolint), str(dockerfile)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{dockerfile}:\n{proc.stdout}{proc.stderr}"


def test_with_ca_exposes_the_extra_ca_only_while_the_command_runs(tmp_path: Path) -> None:
    extra = tmp_path / "ca.pem"
    extra.write_text("-----BEGIN CERTIFICATE-----\nTRAINKITMARKER\n-----END CERTIFICATE-----\n")
    script = "cat \"$PIP_CERT\"; test \"$PIP_CERT\" = \"$REQUESTS_CA_BUNDLE\"; echo \"$PIP_CERT\" > " + str(
        tmp_path / "where"
    )
    proc = subprocess.run(["sh", str(ROOT / "images" / "with-ca.sh"), "sh", "-c", script], capture_output=True,
                          text=True, env={**os.environ, "CA_SECRET_FILE": str(extra)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "TRAINKITMARKER" in proc.stdout
    bundle = Path((tmp_path / "where").read_text().strip())
    assert not bundle.exists(), "the combined bundle outlived the command"
    failing = subprocess.run(["sh", str(ROOT / "images" / "with-ca.sh"), "sh", "-c", "exit 7"],
                             env={**os.environ, "CA_SECRET_FILE": str(extra)})  # fmt: skip
    assert failing.returncode == 7


# -- issue 12 defect 4: a row that does not take flash-attn says why, as data --------------------------------

def test_12_1_keeps_the_bases_flash_attn_1_with_the_reason() -> None:
    entry = matrix.load().entry("12.1")
    reason = entry.skip_args["FLASH_ATTN_SKIP"]
    assert "torch >= 2.2" in reason and "flash_attn_unpadded_func" in reason
    proc = build_py("--cuda", "12.1", "--dry-run")
    assert "flash-attn is not built on this row: flash-attn 2 needs torch >= 2.2" in proc.stdout
    assert "no flash-attn (see below)" in matrix.readme_table()
    assert not matrix.load().entry("12.8").skip_args


def test_a_skip_of_an_unknown_piece_is_a_user_error(tmp_path: Path) -> None:
    bad = tmp_path / "versions.toml"
    bad.write_text((ROOT / "images" / "versions.toml").read_text().replace("skip = { flash-attn", "skip = { apex"))
    with pytest.raises(matrix.UserError, match=r"skips \['apex'\]"):
        matrix.load(bad)


def test_what_a_row_cannot_run_comes_from_its_stack_alone(tmp_path: Path) -> None:
    """A new row is its entry: its "not supported" column is compat's rules on its torch, pins and Python, and a
    table typing it is refused (the rules would drift from it)."""
    text = (ROOT / "images" / "versions.toml").read_text()
    row = ('[cuda."99.1"]\nngc = "99.01"\ncuda_full = "99.1.0"\ntorch = "2.5.1a0+abc.nv99.01"\npython = "3.10"\n'
           'ubuntu = "22.04"\ndriver_min = "999"\narch_list = "9.0"\nincludes = { apex = true }\n'
           'packages = { transformers = "4.57.6" }\n')  # fmt: skip
    new = tmp_path / "versions.toml"
    new.write_text(text + "\n" + row)
    refused = matrix.load(new).entry("99.1").unsupported
    assert list(refused)[:4] == ["TRAIN_PRECISION=fp8", "TRAIN_ATTN=flash_attention_4", "TRAIN_FSDP=full_shard",
                                 "TRAIN_FSDP=shard_grad_op"]  # fmt: skip
    assert "TRAIN_METHOD=dpo" in refused and "TRAIN_REWARD=math" in refused  # Python 3.10: no TRL
    assert "`TRAIN_PRECISION=fp8`, `TRAIN_ATTN=flash_attention_4`" in matrix.readme_table(matrix.load(new))
    new.write_text(text + "\n" + row.replace("python = \"3.10\"", "python = \"3.12\"").replace("2.5.1a0", "2.6.0a0"))
    assert list(matrix.load(new).entry("99.1").unsupported) == [  # torch 2.6 and TRL, on transformers 4
        "TRAIN_ATTN=flash_attention_4", "TRAIN_FSDP=full_shard", "TRAIN_FSDP=shard_grad_op", "TRAIN_MODEL=tiny-moe",
        "TRAIN_RL_TOOLS", "TRAIN_RL_ENVIRONMENT", "TRAIN_DATA=records with images"]  # fmt: skip
    new.write_text(text + '\n[cuda."12.8".unsupported]\n"TRAIN_ATTN=sdpa" = "typed by hand"\n')
    with pytest.raises(matrix.UserError, match=r"cuda.'12.8' has an `unsupported` table"):
        matrix.load(new)


# -- issue 12 defect 6: torch strings as NGC's torch reports them ---------------------------------------------

# Seen inside the images (docs: /work/shared/reference's README, "Facts that matter for the CUDA build path").
NGC_TORCH_SEEN = {"24.05": "2.4.0a0+07cecf4168.nv24.05", "25.03": "2.7.0a0+7c8ec84dab.nv25.03",
                  "25.10": "2.9.0a0+145a3a7bda.nv25.10"}  # fmt: skip


@pytest.mark.parametrize("cuda", CUDAS)
def test_torch_strings_carry_ngcs_suffix(cuda: str) -> None:
    entry = matrix.load().entry(cuda)
    if entry.ngc in NGC_TORCH_SEEN:
        assert entry.torch == NGC_TORCH_SEEN[entry.ngc]
    if "+" not in entry.torch:  # no source gives the build string (26.03: "2.11"): the base check settles it
        assert not entry.verified and re.fullmatch(r"\d+\.\d+", entry.torch), entry.torch
    elif entry.ngc >= "24.01":  # NGC's builds carry ".nvYY.MM" from 24.xx on
        assert entry.torch.endswith(f".nv{entry.ngc}"), entry.torch
    assert f"| {entry.torch} |" in matrix.readme_table()


@pytest.mark.docker
def test_labels_carry_the_torch_the_image_reports(cpu_image: str, docker_client) -> None:
    """The built image's label (build.py reads torch inside the base, before labelling) is what torch reports."""
    probe = "import torch; print(torch.__version__)"
    argv = ["docker", "run", "--rm", "--entrypoint", "python", cpu_image, "-c", probe]
    inside = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()
    assert docker_client.images.get(cpu_image).labels["org.trainkit.torch"] == inside
    assert inside.endswith("+cpu")


# -- issue 12 defect 7: which GPUs a row covers follows from its arch list -------------------------------------

# Compute capabilities per generation, written here apart from matrix.py's table (NVIDIA's CUDA GPUs list).
CC = {"Maxwell": [5.0, 5.2, 5.3], "Pascal": [6.0, 6.1, 6.2], "Volta": [7.0, 7.2], "Turing": [7.5],
      "Ampere": [8.0, 8.6, 8.7], "Ada": [8.9], "Hopper": [9.0],
      "Blackwell": [10.0, 10.3, 11.0, 12.0, 12.1]}  # fmt: skip


def runs_on(arch: str, cc: float) -> bool:
    """Machine code for X.Y runs on X.Z with Z >= Y (PTX aside)."""
    built = float(arch.split("+")[0])
    return int(built) == int(cc) and built <= cc + 1e-9


def claimed(cell: str) -> list[str]:
    text = cell.split(" (`")[0]
    order = list(CC)
    if " to " in text:
        first, last = text.split(" to ")
        return order[order.index(first) : order.index(last) + 1]
    return [g.strip() for g in text.split(",") if g.strip() != "-"]


@pytest.mark.parametrize("doc", ["README.md", "docs/images.md"])
def test_every_rows_claimed_gpus_match_its_arch_list(doc: str) -> None:
    text = (ROOT / doc).read_text()
    for cuda, entry in VERSIONS["cuda"].items():
        row = next(line for line in text.splitlines() if line.startswith(f"| {cuda} "))
        cell = row.split(" | ")[6]
        assert f"(`{entry['arch_list']}`)" in cell, (doc, cuda, cell)
        covered = [g for g, ccs in CC.items() if any(runs_on(a, cc) for a in entry["arch_list"].split() for cc in ccs)]
        assert claimed(cell) == covered, (doc, cuda, cell)


def test_12_8_does_not_claim_volta() -> None:
    assert "Volta" not in gpu_generations.gpu_generations(VERSIONS["cuda"]["12.8"]["arch_list"])
    assert gpu_generations.describe_generations("7.5 8.0 8.6 9.0 10.0 12.0+PTX") == "Turing to Blackwell"
    assert gpu_generations.gpu_generations("7.0") == ["Volta", "Turing"]  # sm_70 code runs on 7.5 too
    assert gpu_generations.gpu_generations("8.6") == ["Ampere", "Ada"]
    assert gpu_generations.gpu_generations("9.0a;10.0") == ["Hopper", "Blackwell"]


def test_no_gpu_claims_outside_the_generated_table() -> None:
    """Comments in versions.toml name no GPU generation: the table derives them from each arch list."""
    comments = [line.split("#", 1)[1] for line in (ROOT / "images" / "versions.toml").read_text().splitlines()
                if "#" in line]  # fmt: skip
    for generation in CC:
        assert not [c for c in comments if generation in c], generation


def trainer_requirements(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "images" / "trainer_requirements.py"), *args],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


@pytest.mark.parametrize("cuda", CUDAS)
def test_every_trainer_requirement_is_held_to_the_rows_pin(cuda: str) -> None:
    """What the image build installs for the trainer: each pyproject requirement with `==` the row's pin."""
    pins = matrix.load().entries[cuda].packages
    proc = trainer_requirements(str(ROOT / "pyproject.toml"), matrix.trainer_pins(pins))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()  # a line may carry an environment marker
    names = [re.split(r"[<>=!~\[,;]", line, maxsplit=1)[0].strip() for line in lines]
    assert "torch" not in names  # the base owns torch (torchao is the trainer's: TRAIN_PRECISION=fp8)
    for name, line in zip(names, lines, strict=True):
        assert f"=={pins[name]}" in line, (cuda, line)


def test_a_requirement_without_a_pin_fails_naming_it() -> None:
    proc = trainer_requirements(str(ROOT / "pyproject.toml"), "pydantic==2.14.3")
    assert proc.returncode == 1
    assert "no pin for pydantic-settings" in proc.stderr and "images/versions.toml" in proc.stderr


def _major(version: str) -> int:
    return int(version.split(".")[0])


def test_every_row_pins_a_pyarrow_its_numpy_and_its_datasets_accept() -> None:
    """pyarrow 26 and pandas 3 refuse NumPy 1.x at import (the 12.1 stand-in's verify caught pyarrow 26; 24 and 25
    import with NumPy 1.26), and datasets 5 requires pyarrow >= 24 (the 12.6 stand-in's pip refused pyarrow 21)."""
    entries = matrix.load().entries
    for cuda in ("12.1", "12.4", "12.6"):  # NumPy 1.x in NGC 23.07 to 24.12
        assert _major(entries[cuda].packages["pyarrow"]) < 26, cuda
        assert _major(entries[cuda].packages["pandas"]) < 3, cuda
    for cuda, entry in entries.items():
        if _major(entry.packages["datasets"]) >= 5:
            assert _major(entry.packages["pyarrow"]) >= 24, (cuda, entry.packages["pyarrow"])


def test_every_sdist_the_build_downloads_has_a_recorded_sha256() -> None:
    """Issue 26, item 14: images/downloads.py checks each sdist against versions.toml's [sha256]; a pin bumped
    without its hash fails here, not halfway through a CUDA build."""
    m = matrix.load()
    for pins in [*(entry.packages for entry in m.entries.values()), m.cpu.packages]:
        for package in ("deepspeed", "flash-attn"):  # build_ext.py fetches these two as sdists
            if package in pins:
                name = f"{package.replace('-', '_')}-{pins[package]}.tar.gz"
                assert re.fullmatch(r"[0-9a-f]{64}", m.sha256.get(name, "")), f"no sha256 for {name}"
    words = matrix.dockerfile_defaults(m)["ARTIFACT_SHA256"].split()
    assert words == [f"{name}={digest}" for name, digest in sorted(m.sha256.items())]
    assert f'ARG ARTIFACT_SHA256="{" ".join(words)}"' in (ROOT / "Dockerfile").read_text()
    plan = build_py("--cuda", "12.8", "--dry-run", "--allow-unhashed")
    assert plan.returncode == 0 and "are used unverified" in plan.stdout, plan.stderr
