"""What the verifier refuses on the CUDA path, and training, on the default row's (12.8) stand-in image."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from image_runs import train_tiny_in

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def verify_after(image: str, change: str) -> subprocess.CompletedProcess:
    """Run the image's verifier after a shell `change` made as root in a throwaway container."""
    return subprocess.run(["docker", "run", "--rm", "--user", "0", "--entrypoint", "sh", image, "-c",
                           f"{change} && python /opt/trainkit/images/verify.py"],
                          capture_output=True, text=True, timeout=600)  # fmt: skip


def test_a_false_claim_and_a_jit_only_op_fail_the_build_naming_them(standin_default: str, standin_build,
                                                                    docker_client) -> None:
    """Claims added just before the verify layer (only it reruns): flash-attn (not installed) and DeepSpeed's
    fused_lamb (not prebuilt: it would be JIT-compiled at start-up)."""
    tag = "trainkit:test-standin-false-claim"
    proc = standin_build("12.8", "--tag", tag, "--build-arg", "VERIFY_EXTRA_CLAIMS=flash_attn,deepspeed:fused_lamb")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "verification failed" in proc.stderr
    assert "flash_attn: import flash_attn failed" in proc.stderr
    assert "deepspeed:fused_lamb: DeepSpeed op fused_lamb is not installed prebuilt" in proc.stderr
    assert not [i for i in docker_client.images.list() if tag in i.tags]


def test_verify_refuses_ops_compiled_for_the_cpu_accelerator(standin_default: str) -> None:
    """Defect 1's symptom: a wheel recording accelerator_name='cpu' on the CUDA flavor."""
    info = "/usr/local/lib/python3*/dist-packages/deepspeed/git_version_info_installed.py"
    proc = verify_after(standin_default, f"sed -i \"s/accelerator_name='cuda'/accelerator_name='cpu'/\" {info}")
    assert proc.returncode == 1
    assert "deepspeed:accelerator: DeepSpeed's ops were compiled for accelerator 'cpu', the image needs 'cuda'" in (
        proc.stderr
    )
    # Each op says it would be JIT-compiled, without compiling it (DeepSpeed loads a prebuilt op only for its own
    # accelerator).
    jit = "deepspeed:fused_adam: DeepSpeed op fused_adam would be JIT-compiled: it was built for accelerator 'cpu'"
    assert jit in proc.stderr


def test_verify_refuses_an_arch_without_machine_code(standin_default: str) -> None:
    """The build compiled sm_90 only: claiming 8.0 as well must fail, naming the missing arch."""
    manifest = "/opt/trainkit/build-manifest.json"
    proc = verify_after(standin_default, f"sed -i 's/\"arch_list\": \"9.0\"/\"arch_list\": \"8.0 9.0\"/' {manifest}")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "deepspeed:fused_adam: DeepSpeed op fused_adam lacks machine code for ['sm_80'] (has ['sm_90'])" in (
        proc.stderr
    )


def test_12_8_stand_in_trains_the_tiny_preset_on_cpu(standin_default: str, tmp_path: Path) -> None:
    assert train_tiny_in(standin_default, tmp_path / "output", "train")[-1] == 2
