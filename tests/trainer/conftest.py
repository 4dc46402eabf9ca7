"""Shared fixtures for tests/trainer: run `python -m trainer ...` as a real subprocess with a clean environment.

    def test_something(run_trainer, trainer_env):  # also: run_python, config_json, imported_modules
        result = run_trainer(["config", "--json"], env={**trainer_env, "TRAIN_LR": "0.01"})
        assert result.returncode == 0, result.stderr

`run_trainer` never inherits the caller's TRAIN_* (or any other) variables: only a minimal base environment
(PATH, HOME, offline Hugging Face settings, a private HF_HOME) plus what the test passes.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers import write_corpus
from hub_server import HubServer
from hub_support import GATED_ID, MODEL_ID, TOKEN, run_env, save_tiny_model

REPO = Path(__file__).resolve().parents[2]
VENV_PYTHON = REPO / ".venv" / "bin" / "python"
# The venv pytest runs in is the one tested (e.g. .venv-oldest for the 12.1 row: tests/trainer/test_rows.py).
IN_A_VENV = sys.prefix != sys.base_prefix
PYTHON = sys.executable if IN_A_VENV or not VENV_PYTHON.exists() else str(VENV_PYTHON)

RunTrainer = Callable[..., subprocess.CompletedProcess]
LLAMA_CPP_SETUP = REPO / "scripts" / "setup_llama_cpp.py"
# The CPU instruction path (MKL, oneDNN, ATen) the trainer computes on: passed through, so that the suite runs on
# another one as a whole (`MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 pytest ...`:
# an AVX2-only machine's results on an AVX-512 one); AVX2 names that path for the tests that train on it on purpose.
ISA_VARIABLES = ("MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")
AVX2 = {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


def base_env(home: Path | None = None) -> dict[str, str]:
    """The minimal environment a trainer subprocess starts from (no TRAIN_* at all)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        **{name: os.environ[name] for name in ISA_VARIABLES if name in os.environ},
    }
    if home is not None:
        env["HOME"] = str(home)
        env["HF_HOME"] = str(home / "hf")
    elif "HOME" in os.environ:
        env["HOME"] = os.environ["HOME"]
    return env


def run_python(
    argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 300, cwd: str | Path = REPO
) -> subprocess.CompletedProcess:
    """`python argv...` (the project's interpreter) with base_env() + env; the result carries `.elapsed` seconds
    (wall clock) and `.cpu_s` (the child's user + system CPU seconds: what it cost, whatever the machine's load)."""
    full_env = {**base_env(), **(env or {})}
    start, before = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(
        [PYTHON, *argv], env=full_env, cwd=str(cwd), capture_output=True, text=True, timeout=timeout, check=False
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result.elapsed = time.monotonic() - start  # type: ignore[attr-defined]
    result.cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)  # type: ignore[attr-defined]
    return result


def run_trainer(
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
    *,
    module: str = "trainer",
    python_args: Sequence[str] = (),
    cwd: str | Path = REPO,
) -> subprocess.CompletedProcess:
    """`python [python_args] -m module args` with base_env() + env; the result carries `.elapsed` seconds."""
    return run_python([*python_args, "-m", module, *args], env=env, timeout=timeout, cwd=cwd)


def config_json(env: Mapping[str, str], timeout: float = 300) -> dict[str, Any]:
    """`python -m trainer config --json` under `env`; fails the test with stderr when it does not exit 0."""
    result = run_trainer(["config", "--json"], env=env, timeout=timeout)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-3000:]}"
    return json.loads(result.stdout)


def run_trainer_in_process(args: Sequence[str], env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """run_trainer's result (exit code, stdout, stderr) for `python -m trainer args` run in this process
    (trainer.__main__.main) under the environment run_trainer gives it, base_env() + env and nothing else: for a
    command decided before any work (`config`), without an interpreter, torch and Transformers started per call.
    What the command changes process-wide is put back after it: the environment (Transformers' TrainingArguments
    sets ACCELERATE_* there), the stop-signal handlers, the "trainer" logger's handlers, Accelerate's shared state,
    Transformers' DeepSpeed config, and the library switches of trainer.library_patches; Transformers' trainer_utils
    is imported first with PEFT visible (`config` hides PEFT before it imports it: trainer_utils would keep that).
    Unlike a new process's, the command's environment lacks what a library puts there at its first import in this
    process (importing transformers.training_args sets TORCHINDUCTOR_CACHE_DIR, which the compile decision reads)."""
    import contextlib
    import io
    import logging
    import signal

    import accelerate.utils.other
    import transformers.integrations.deepspeed as hf_deepspeed
    import transformers.trainer_utils  # with PEFT visible, as a later run in this process expects
    import transformers.utils
    from accelerate.state import AcceleratorState, PartialState

    from trainer.__main__ import main

    kept_environ = dict(os.environ)
    kept_signals = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    logger = logging.getLogger("trainer")
    kept_logger = (logger.handlers, logger.propagate, logger.level)
    kept_states = [(state, dict(state._shared_state)) for state in (PartialState, AcceleratorState)]
    kept_switches = (transformers.utils.is_peft_available, accelerate.utils.other.is_deepspeed_available,
                     hf_deepspeed._hf_deepspeed_config_weak_ref)  # fmt: skip
    stdout, stderr = io.StringIO(), io.StringIO()
    os.environ.clear()
    os.environ.update({**base_env(), **(env or {})})
    logger.handlers = []
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse's refusal of the command line
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.environ.clear()
        os.environ.update(kept_environ)
        for signum, handler in kept_signals.items():
            signal.signal(signum, handler)
        logger.handlers, logger.propagate, logger.level = kept_logger
        for state, kept in kept_states:
            state._shared_state.clear()
            state._shared_state.update(kept)
        (transformers.utils.is_peft_available, accelerate.utils.other.is_deepspeed_available,
         hf_deepspeed._hf_deepspeed_config_weak_ref) = kept_switches  # fmt: skip
    return subprocess.CompletedProcess(["-m", "trainer", *args], code, stdout.getvalue(), stderr.getvalue())


def config_json_in_process(env: Mapping[str, str]) -> dict[str, Any]:
    """config_json's result from `config --json` run in this process (run_trainer_in_process)."""
    result = run_trainer_in_process(["config", "--json"], env=env)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-3000:]}"
    return json.loads(result.stdout)


def imported_modules(importtime_stderr: str) -> set[str]:
    """Module names from `python -X importtime` output."""
    names = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


@pytest.fixture(name="run_python", scope="session")
def run_python_fixture() -> RunTrainer:
    """`run_python(argv, env=None, timeout=300, cwd=REPO)`: the project's python with a clean environment."""
    return run_python


@pytest.fixture(name="run_trainer", scope="session")
def run_trainer_fixture() -> RunTrainer:
    """`run_trainer(args, env=None, timeout=300, *, module="trainer", python_args=(), cwd=REPO)`."""
    return run_trainer


@pytest.fixture(name="config_json", scope="session")
def config_json_fixture() -> Callable[..., dict[str, Any]]:
    """`config_json(env) -> dict`: the parsed output of `python -m trainer config --json` (asserts exit 0)."""
    return config_json


@pytest.fixture(name="run_trainer_in_process", scope="session")
def run_trainer_in_process_fixture() -> RunTrainer:
    """`run_trainer_in_process(args, env=None)`: run_trainer's result, the command run in this process."""
    return run_trainer_in_process


@pytest.fixture(name="config_json_in_process", scope="session")
def config_json_in_process_fixture() -> Callable[..., dict[str, Any]]:
    """`config_json_in_process(env) -> dict`: config_json's result, the command run in this process."""
    return config_json_in_process


@pytest.fixture(name="imported_modules", scope="session")
def imported_modules_fixture() -> Callable[[str], set[str]]:
    """`imported_modules(stderr_of_python_-X_importtime) -> set of module names`."""
    return imported_modules


@pytest.fixture
def trainer_env(tmp_path: Path) -> dict[str, str]:
    """TRAIN_* for a quick CPU run writing under tmp_path (data: the default /data, i.e. the embedded corpus when
    the machine has no /data)."""
    home = tmp_path / "home"
    home.mkdir()
    return {
        "HOME": str(home),
        "HF_HOME": str(home / "hf"),
        "TRAIN_OUTPUT_DIR": str(tmp_path / "output"),
    }


@pytest.fixture
def small_disk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A tmpfs of the size given as the fixture's parameter, mounted for the test only."""
    size = request.param
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (the test suite runs as root in CI)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    """A small .txt data file."""
    return write_corpus(tmp_path / "data" / "corpus.txt", lines=200)


# ---- the stand-in Hugging Face Hub (tests/trainer/hub_server.py, hub_support.py) ----


@pytest.fixture(scope="session")
def tiny_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    return save_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def tiny_files_v2(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """Other weights: a later commit on the same branch."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny-model-v2"), seed=1)


@pytest.fixture
def hub(tiny_files: dict[str, bytes]) -> Iterator[HubServer]:
    """The stand-in Hub with MODEL_ID (open) and GATED_ID (readable with TOKEN only)."""
    server = HubServer().start()
    server.repo(MODEL_ID).commit(tiny_files)
    gated = server.repo(GATED_ID)
    gated.commit(tiny_files)
    gated.gated_token = TOKEN
    gated.refused_tokens = ("hf_expiredTokenThatTheHubRefuses1",)
    yield server
    server.stop()


# ---- export --quant's tiny run and its GGUF export (test_export_quant.py, test_serve_check.py) ----


@pytest.fixture(scope="session")
def llama_cpp() -> Path:
    """llama.cpp's converter folder (the binding and its server, built and installed once: setup_llama_cpp.py)."""
    result = subprocess.run([PYTHON, str(LLAMA_CPP_SETUP)], capture_output=True, text=True, timeout=3600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return Path(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny preset trained on the embedded corpus: enough steps that it predicts bytes far better than chance;
    its tokenizer saved with the chatml template (plain text is trained as it is)."""
    root = tmp_path_factory.mktemp("quant-run")
    env = run_env(root, max_steps=60, save_steps=60, seq_len=64, batch_size=4, lr=0.003, chat_template="chatml")
    result = run_trainer([], env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return root


@pytest.fixture(scope="session")
def lora_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA run on a saved tiny base (the base it records: root/base), trained on a corpus file (root/corpus.txt,
    its TRAIN_DATA): its checkpoint-2 holds the adapter only, its final/ the merged model. Export's tests read it
    (test_export.py, test_export_faults.py); a test that moves a file of it puts it back."""
    root = tmp_path_factory.mktemp("lora-run")
    save_tiny_model(root / "base")
    corpus = write_corpus(root / "corpus.txt")
    env = run_env(root, model=root / "base", lora=1, lr=0.01, max_steps=2, save_steps=2, data=corpus)
    result = run_trainer([], env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return root


@pytest.fixture(scope="session")
def tiny_gguf_export(tiny_run: Path, llama_cpp: Path, tmp_path_factory: pytest.TempPathFactory
                     ) -> tuple[Path, subprocess.CompletedProcess]:  # fmt: skip
    """`export --quant f16 --quant q8_0 --quant q4_k_m` of the tiny run, made once: OUT (named out) and the export's
    result."""
    out = tmp_path_factory.mktemp("tiny-gguf") / "out"
    env = {**run_env(tiny_run), "TRAINKIT_LLAMA_CPP": str(llama_cpp)}
    result = run_trainer(["export", str(tiny_run / "output"), str(out), "--quant", "f16", "--quant", "q8_0",
                          "--quant", "q4_k_m"], env=env, timeout=900)  # fmt: skip
    return out, result
