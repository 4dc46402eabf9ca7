"""Every CUDA row's pins install together on that row's own Python (3.10 for 12.1 and 12.4), by pip's resolver
against PyPI: the trackers (wandb, mlflow-skinny) included, next to the row's NumPy and the PyPI torch of its
stand-in. No image is built: a pin that cannot live with the others fails here in seconds, not halfway through
a 25-minute stand-in build. The imports themselves are proven where images are made (images/verify.py imports
every package the trainer uses, the trackers too) and on the host for the oldest and newest stacks."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "images"))
sys.path.insert(0, str(ROOT / "scripts"))
import matrix  # noqa: E402
import trainer_requirements  # noqa: E402
from standin_base import load_standin  # noqa: E402

# Built inside the image, not resolved from PyPI wheels: deepspeed and flash-attn from their sdists (DeepSpeed's
# requirements resolve in the image), python-hostlist is an sdist with no requirements of its own; lm-eval is a
# wheel, but three of its pure-Python requirements (sqlitedict, rouge-score, word2number) are sdists only, which a
# wheels-only dry run for another Python cannot take: it resolves in the image build. So does num2words (a wheel)
# with its one requirement, docopt, an sdist only (pure Python, no Requires-Python: installed by hand on 3.10 and 3.12).
NOT_FROM_WHEELS = {"deepspeed", "flash-attn", "python-hostlist", "lm-eval", "num2words", "docopt"}
# What the Dockerfile installs next to the trainer's own requirements (its runtime stage).
DOCKERFILE_PINS = ("transformers", "accelerate", "datasets", "peft", "bitsandbytes", "dumb-init")
# Ubuntu 22.04 / 24.04 bases (glibc 2.35+) take any of these; older wheels (torch 2.1's) carry the legacy names.
GLIBC_TAGS = ["manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64",
              *(f"manylinux_2_{minor}_x86_64" for minor in range(17, 40))]  # fmt: skip


def row_requirements(entry: matrix.Entry) -> list[str]:
    """The row's install set as the image asks for it, with the stand-in's PyPI torch in place of NGC's."""
    pins, standin = entry.packages, load_standin(entry)
    # Resolved for the row's Python, as the image build does (pip's --python-version does not evaluate markers: e.g.
    # TRL, asked for on Python >= 3.11 only, is left out of the 3.10 rows).
    trainer = trainer_requirements.requirements(str(ROOT / "pyproject.toml"), pins, entry.python)
    wanted = [*trainer, *(f"{name}=={pins[name]}" for name in DOCKERFILE_PINS if name in pins)]
    base = [f"torch=={standin.torch}", *(p for p in standin.packages if p.split("==")[0] not in pins)]
    return [req for req in wanted if re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0] not in NOT_FROM_WHEELS] + base


ROWS = [*matrix.load().entries, matrix.RL_ROW]  # every CUDA row and the online-RL row (its stand-in: PyPI's vLLM)


def row(name: str) -> matrix.Entry:
    loaded = matrix.load()
    return loaded.rl if name == matrix.RL_ROW and loaded.rl else loaded.entry(name)


# pip's dry runs wait on PyPI's index and compute (with pip's HTTP cache cold, about 170 s of wall time and as many
# CPU-seconds for the ten rows here), so the rows resolve side by side, at most this many at a time, and each test
# waits for its own.
AT_ONCE = 5


def resolve(entry: matrix.Entry, target: Path) -> subprocess.CompletedProcess[str]:
    """pip's resolution of the row's install set for its Python and glibc, as a JSON report (nothing installed)."""
    platforms = [arg for tag in GLIBC_TAGS for arg in ("--platform", tag)]
    argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", "-",
            "--only-binary=:all:", "--python-version", entry.python, "--implementation", "cp", *platforms,
            "--target", str(target), *row_requirements(entry)]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def resolutions(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[dict[str, Future]]:  # fmt: skip
    """The selected rows' resolutions, started together."""
    selected = [item.callspec.params["cuda"] for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")]  # fmt: skip
    with ThreadPoolExecutor(max_workers=AT_ONCE) as pool:
        yield {cuda: pool.submit(resolve, row(cuda), tmp_path_factory.mktemp("target")) for cuda in selected}


@pytest.mark.parametrize("cuda", ROWS)
def test_the_rows_pins_and_the_trackers_resolve_together_on_its_python(cuda: str, resolutions: dict) -> None:
    entry = row(cuda)
    proc = resolutions[cuda].result()
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")]
    assert proc.returncode == 0, f"CUDA {cuda} (Python {entry.python}): " + "\n".join(errors or [proc.stderr[-3000:]])
    chosen = {item["metadata"]["name"].lower(): item["metadata"]["version"]
              for item in json.loads(proc.stdout)["install"]}  # fmt: skip
    for name in ("wandb", "mlflow-skinny", "transformers", "tensorboard", "pydantic"):
        assert chosen[name] == entry.packages[name], (cuda, name, chosen.get(name))
    assert chosen["torch"] == load_standin(entry).torch
