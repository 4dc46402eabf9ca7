#!/usr/bin/env bash
# The wheels benchmarks/gpu_run.py carries to a GPU machine without network (docs/benchmarks.md, "The GPU run"):
# the trainer's pure-Python dependencies that machine lacks, at the pins of images/versions.toml, for CPython 3.12 on
# x86-64 Linux, into .whl/ (git-ignored). gpu_run.py unpacks them there ahead of the machine's own packages.
# pydantic-core is compiled: its version is the one pydantic's metadata requires. torchao (TRAIN_PRECISION=fp8) is the
# default pin, the release for torch >= 2.11 (the GPU machine has 2.11); its abi3 wheel unpacks like the others.
set -euo pipefail
cd "$(dirname "$0")/.."
pin() { python3 -c "import tomllib,sys; print(tomllib.load(open('images/versions.toml','rb'))['packages'][sys.argv[1]])" "$1"; }
# Not pinned in versions.toml (pydantic's own dependencies); the versions tests/run.sh installs beside pydantic 2.14.3.
PYDANTIC_CORE=2.50.4 ANNOTATED_TYPES=0.8.0 TYPING_INSPECTION=0.4.5 TYPING_EXTENSIONS=4.16.0
rm -rf .whl && mkdir -p .whl
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  "transformers==$(pin transformers)" "pydantic==$(pin pydantic)" "pydantic-core==$PYDANTIC_CORE" \
  "pydantic-settings==$(pin pydantic-settings)" "python-dotenv==$(pin python-dotenv)" \
  "annotated-types==$ANNOTATED_TYPES" \
  "typing-inspection==$TYPING_INSPECTION" "typing-extensions==$TYPING_EXTENSIONS" \
  "torchao==$(pin torchao)"
# python-hostlist is published as a source archive only: build its (pure-Python) wheel.
python3 -m pip wheel --no-deps --no-build-isolation -w .whl "python-hostlist==$(pin python-hostlist)" ||
  cp "$(find ~/.cache/pip/wheels -name "python_hostlist-$(pin python-hostlist)-py3-none-any.whl" | head -1)" .whl/
du -ch .whl/*.whl | tail -1
