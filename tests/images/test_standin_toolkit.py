"""The stand-in toolkit's nvcc.profile (images/standin-base/cuda_home.py), on the host: no Docker, no nvcc.

The base build itself proves that nvcc compiles thrust and cub with it (cuda_home.prove_cccl); these tests pin
the layout rule: CUDA 13 toolkits keep CCCL in include/cccl, which the profile must add as NVIDIA's does.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
CCCL_LINE = 'SYSTEM_INCLUDES +=  "-isystem" "$(TOP)/include/cccl" $(_SPACE_)'


def load_cuda_home(monkeypatch: pytest.MonkeyPatch, cuda_home: Path) -> ModuleType:
    monkeypatch.setenv("CUDA_HOME", str(cuda_home))
    spec = importlib.util.spec_from_file_location("cuda_home", ROOT / "images" / "standin-base" / "cuda_home.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_cuda_13_layout_puts_include_cccl_on_nvccs_system_include_path(monkeypatch, tmp_path: Path) -> None:
    (tmp_path / "include" / "cccl" / "thrust").mkdir(parents=True)
    profile = load_cuda_home(monkeypatch, tmp_path).nvcc_profile()
    assert CCCL_LINE in profile.splitlines()
    assert '"-I$(TOP)/include"' in profile


def test_a_cuda_12_layout_keeps_cccl_in_include_and_adds_no_cccl_path(monkeypatch, tmp_path: Path) -> None:
    (tmp_path / "include" / "thrust").mkdir(parents=True)
    module = load_cuda_home(monkeypatch, tmp_path)
    assert module.nvcc_profile() == module.NVCC_PROFILE
    assert "cccl" not in module.nvcc_profile()
