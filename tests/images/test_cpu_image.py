"""The CPU image built from this tree by `scripts/build.py --cpu`: a real engine, real builds, real training."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from image_runs import train_tiny_in

pytestmark = [pytest.mark.docker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "build" / "records"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
VERSIONS_TOML = (ROOT / "images" / "versions.toml").read_text()


def run_in(client, image: str, command: str, **kwargs) -> str:
    """Output of `sh -c command` in a throwaway container (the entrypoint bypassed)."""
    out = client.containers.run(image, ["-c", command], entrypoint="sh", remove=True, stdout=True, stderr=True,
                                **kwargs)  # fmt: skip
    return out.decode()


def record_for(tag: str) -> dict:
    path = RECORDS / (tag.replace(":", "_") + ".json")
    assert path.is_file(), f"no build record at {path}"
    return json.loads(path.read_text())


def test_labels_carry_oci_keys_and_every_component_version(cpu_image: str, docker_client) -> None:
    labels = docker_client.images.get(cpu_image).labels
    for key in ("version", "revision", "created", "source", "title", "base.name", "base.digest"):
        assert labels.get(f"org.opencontainers.image.{key}"), key
    assert labels["org.opencontainers.image.version"] == "0.1.0"
    assert labels["org.trainkit.flavor"] == "cpu"
    assert labels["org.trainkit.torch"].startswith("2.13.0")
    for package in ("transformers", "accelerate", "datasets", "peft", "bitsandbytes", "deepspeed"):
        read_inside = labels[f"org.trainkit.pin.{package}"]  # a local build of the pinned release may add +cpu
        assert f'{package} = "{read_inside.split("+")[0]}"' in VERSIONS_TOML
    assert labels["org.trainkit.pin.deepspeed"] == "0.19.8+cpu"  # what is inside, not only what was planned
    base = docker_client.images.get(labels["org.opencontainers.image.base.name"]).labels
    assert labels["org.trainkit.base.from"] == base["org.trainkit.base.from"]  # which Debian, once published too


def test_labels_name_what_is_inside_and_nothing_of_the_build_tools(cpu_image: str, docker_client) -> None:
    labels = docker_client.images.get(cpu_image).labels
    assert not [key for key in labels if key.startswith("com.docker.compose.")], labels
    assert labels["org.trainkit.pin.flash-attn"].startswith("skipped: torch 2.13.0+cpu is a CPU build")
    assert labels["org.trainkit.apex-ref"].startswith("skipped: torch 2.13.0+cpu is a CPU build")


def test_both_tags_name_the_same_image(cpu_image: str, docker_client) -> None:
    assert docker_client.images.get("trainkit:0.1.0-cpu").id == docker_client.images.get(cpu_image).id


def test_build_record_holds_versions_read_inside_the_image(cpu_image: str, docker_client) -> None:
    record = record_for("trainkit:0.1.0-cpu")
    assert record["image"]["id"] == docker_client.images.get(cpu_image).id
    assert record["base"]["id"].startswith("sha256:")
    inside = record["versions_inside"]
    assert inside["torch"] == "2.13.0+cpu"
    assert inside["deepspeed"] == "0.19.8+cpu"  # the pinned release, built here for the CPU flavor
    assert inside["transformers"] == "5.23.0"
    assert {"base_s", "build_s", "verify_s", "total_s"} <= set(record["durations"])
    assert record["inputs"]["build_args"]["BASE_IMAGE"] == record["base"]["image"]
    skipped = {s["piece"]: s["reason"] for s in record["skipped"]}
    assert "CPU build" in skipped["flash_attn"] and "CPU build" in skipped["apex"]
    assert "deepspeed:fused_adam" in skipped
    assert all(c["status"] in ("ok", "skipped") for c in record["checks"])
    # llama.cpp for export --quant (issue 56): proven in the build (a two-layer model exported to q8_0 and scored in
    # llama.cpp), the wheel's sha256 and the path the build took recorded, the label saying the row carries it
    assert next(c for c in record["checks"] if c["name"] == "llama_cpp")["status"] == "ok"
    llama = record["llama_cpp"]
    assert llama["status"] == "built" and len(llama["wheel_sha256"]) == 64
    assert llama["source"].startswith(("taken, not compiled: the prebuilt wheel", "compiled from the sdist in"))
    assert record["labels"]["org.trainkit.gguf-export"].startswith("accepted: GGUF types through llama.cpp")
    # llmcompressor for export --quant fp8/w4a16: its overlay in the image, proven by an fp8 export of a two-layer
    # model inside it, scored through compressed-tensors
    fp8 = next(c for c in record["checks"] if c["name"] == "llmcompressor")
    assert fp8["status"] == "ok" and "fp8/" in fp8["detail"] and "perplexity ratio" in fp8["detail"], fp8
    assert record["manifest"]["extensions"]["llmcompressor"]["status"] == "built"
    assert record["labels"]["org.trainkit.compressed-export"].startswith("accepted: fp8 and w4a16 through llmcomp")


def test_manifest_claims_hold_inside_the_image(cpu_image: str, docker_client) -> None:
    manifest = json.loads(run_in(docker_client, cpu_image, "cat /opt/trainkit/build-manifest.json"))
    ops = manifest["extensions"]["deepspeed"]["ops"]
    assert ops["cpu_adam"]["status"] == "built"
    assert ops["async_io"]["status"] == "built"
    assert ops["fused_adam"]["status"] == "skipped"
    assert manifest["extensions"]["flash_attn"]["status"] == "skipped"
    # --json: the export checks report the build's own proofs (a second q8_0 + fp8 export here would prove nothing
    # new; the in-image export as the user is tests/compose/test_run_py.py's), the rest are checked again
    out = run_in(docker_client, cpu_image, "python /opt/trainkit/images/verify.py --json >/dev/null")
    assert "verification passed" in out
    assert "(the build's verify step)" in out.split("llmcompressor", 1)[1].splitlines()[0]
    assert "ok       deepspeed:cpu_adam" in out
    # DeepSpeed loads cpu_adam prebuilt: nothing is JIT-compiled into an empty extensions folder.
    load = (
        "from deepspeed.accelerator import get_accelerator; import os; "
        "m = get_accelerator().create_op_builder('CPUAdamBuilder').load(); "
        "print(m.__file__, os.listdir(os.environ['TORCH_EXTENSIONS_DIR']))"
    )
    out = run_in(docker_client, cpu_image, f"TORCH_EXTENSIONS_DIR=$(mktemp -d) python -c \"{load}\"")
    assert "site-packages" in out or "dist-packages" in out
    assert out.strip().endswith("[]")


def test_runs_as_an_arbitrary_uid_with_writable_caches(cpu_image: str, docker_client) -> None:
    out = run_in(docker_client, cpu_image, "touch $HOME/x $HF_HOME/x $TORCH_EXTENSIONS_DIR/x /output/x && "
                 "echo $HF_HOME $TRITON_CACHE_DIR $TORCHINDUCTOR_CACHE_DIR", user="4321:4321")  # fmt: skip
    assert out.split() == ["/cache/huggingface", "/cache/triton", "/cache/inductor"]
    config = docker_client.images.get(cpu_image).attrs["Config"]
    assert config["Entrypoint"] == ["dumb-init", "--", "/opt/trainkit/entrypoints/entrypoint.sh"]
    # the entrypoint names a UID without a passwd entry in one word (torch's inductor puts it in a path it compiles
    # with g++; `id -un`'s bare number and a newline broke it). The line ends in a newline: the SDK reads the output
    # through the engine's log API, which here returned nothing of a last line without one.
    named = docker_client.containers.run(cpu_image, ["shell", "-c", 'printf "[%s][%s]\\n" "$USER" "$LOGNAME"'],
                                         user="4321:4321", remove=True, stdout=True, stderr=False)  # fmt: skip
    assert named.decode().splitlines()[-1] == "[uid4321][uid4321]", named
    assert config["Cmd"] == ["train"]


def test_image_trains_the_tiny_preset(cpu_image: str, tmp_path: Path, docker_client) -> None:
    out = tmp_path / "output"
    assert train_tiny_in(cpu_image, out, "python", "-m", "trainer")[-1] == 2
    # issue 26, item 12: the image's default user is not root, and what it wrote belongs to that user
    assert docker_client.images.get(cpu_image).attrs["Config"]["User"] == "1000:1000"
    assert {p.stat().st_uid for p in out.rglob("*")} == {1000}


def test_the_threads_follow_the_containers_cpu_quota(cpu_image: str, docker_client) -> None:
    """`docker run --cpus 1` on a machine with more cores: torch alone starts one thread per core it sees, quota or
    not; the trainer's thread rule (trainer/machine/threads.py) reads the container's own cgroup and takes one."""
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("one core: a quota of one core lowers nothing here")
    script = ("import torch; from trainer.machine.threads import thread_env; added, line = thread_env({}); "
              "print(torch.get_num_threads()); print(added['OMP_NUM_THREADS']); print(line)")  # fmt: skip
    out = docker_client.containers.run(cpu_image, ["-c", script], entrypoint="python", nano_cpus=10**9, remove=True,
                                       stdout=True, stderr=False).decode().splitlines()  # fmt: skip
    assert out[:2] == [str(cores), "1"], out
    assert out[2].startswith(f"threads: 1 per process (1 usable cores: {cores} in this process's CPU affinity, but "
                             "its CPU quota (cgroup "), out[2]  # fmt: skip
    assert "pays for 1 cores)" in out[2] and "OMP_WAIT_POLICY=PASSIVE" in out[2]


def test_no_ca_or_secret_in_history_or_filesystem(cpu_image: str, docker_client) -> None:
    history = subprocess.run(["docker", "history", "--no-trunc", cpu_image], capture_output=True, text=True,
                             check=True).stdout  # fmt: skip
    assert "BEGIN CERTIFICATE" not in history
    assert str(HOST_CA_BUNDLE) not in history and "TRAINKIT_CA_CERT" not in history
    env = docker_client.images.get(cpu_image).attrs["Config"]["Env"]
    assert not [e for e in env if "CERT" in e or "CA_BUNDLE" in e]
    # The certificates the build trusted beyond the image's own bundle (e.g. a proxy's CA) appear nowhere.
    system = run_in(docker_client, cpu_image, "cat /etc/ssl/certs/ca-certificates.crt")
    extra = [b for b in pem_blocks(HOST_CA_BUNDLE.read_text()) if b not in system] if HOST_CA_BUNDLE.is_file() else []
    if not extra:
        pytest.skip("the build's CA bundle adds nothing to the image's own: nothing to look for")
    needles = [block.splitlines()[3] for block in extra[:5]]  # a line from inside each certificate's body
    pattern = "|".join(needles)
    hits = run_in(docker_client, cpu_image,
                  f"grep -rlE '{pattern}' / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev 2>/dev/null; true")
    assert hits.strip() == "", f"build CA found in the image: {hits}"


def pem_blocks(text: str) -> list[str]:
    blocks, current = [], []
    for line in text.splitlines():
        if "BEGIN CERTIFICATE" in line:
            current = [line]
        elif current:
            current.append(line)
            if "END CERTIFICATE" in line:
                blocks.append("\n".join(current))
                current = []
    return blocks


def test_verification_fails_a_build_whose_claimed_extension_is_missing(cpu_image: str, docker_client) -> None:
    """A false claim added before the verify step (only that layer reruns) must fail the build, naming it."""
    tag = "trainkit:test-false-claim"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build.py"), "--cpu", "--tag", tag,
         "--build-arg", "VERIFY_EXTRA_CLAIMS=flash_attn,deepspeed:fused_adam"],
        capture_output=True, text=True, cwd=ROOT, timeout=1800,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "verification failed" in proc.stderr
    assert "flash_attn: import flash_attn failed" in proc.stderr
    assert "deepspeed:fused_adam" in proc.stderr
    assert "Traceback (most recent call last)" not in proc.stderr.split("verification failed")[0][-200:]
    assert not [i for i in docker_client.images.list() if tag in i.tags]


def test_torch_guard_and_verifier_reject_a_changed_torch(cpu_image: str, docker_client) -> None:
    guard = "echo 2.0.0 > /opt/trainkit-build/base-torch.txt && python /opt/trainkit-build/build_ext.py guard-torch"
    proc = subprocess.run(["docker", "run", "--rm", "--user", "0", "--entrypoint", "sh", cpu_image, "-c", guard],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode != 0
    assert "torch changed during the build: the base ships 2.0.0, now 2.13.0+cpu" in proc.stderr
    verify = ("sed -i 's/\"version\": \"2.13.0+cpu\"/\"version\": \"2.0.0\"/' /opt/trainkit/build-manifest.json && "
              "python /opt/trainkit/images/verify.py")  # fmt: skip
    proc = subprocess.run(["docker", "run", "--rm", "--user", "0", "--entrypoint", "sh", cpu_image, "-c", verify],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 1
    assert "torch: torch is 2.13.0+cpu, the base shipped 2.0.0" in proc.stderr
    for export in ("llama_cpp", "llmcompressor"):  # after a failure the exports are not run (half a minute each)
        assert f"not run  {export:22} an earlier check failed" in proc.stdout, proc.stdout
