"""Processes that must not outlive their parent: a trainer left running holds the GPUs and the output folder's lock.

Linux's PR_SET_PDEATHSIG makes the kernel SIGKILL a process when its parent dies, whatever killed the parent. The
launcher asks it for its child (torchrun, or the trainer: trainer.launch.supervise); torchrun does not ask it for its
workers, so a torchrun killed with its launcher left them training. `python -m trainer` asks it for itself when it
is a torchrun worker, first thing, before its imports.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1  # linux/prctl.h
# torchrun sets it for its workers; of the variables a worker sees, only it means "inside torchrun" (enroot's
# 50-slurm-pytorch.sh hook exports LOCAL_RANK, RANK, ... into every job: trainer.launch.decide).
TORCHRUN_MARKER = "TORCHELASTIC_RUN_ID"


def die_with_parent() -> None:
    """From now on, SIGKILL this process when its parent dies (Linux; elsewhere nothing)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def die_with_torchrun() -> None:
    """In a torchrun worker, die with torchrun (nothing elsewhere)."""
    if os.environ.get(TORCHRUN_MARKER):
        die_with_parent()
