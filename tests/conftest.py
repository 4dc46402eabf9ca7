"""Session fixtures shared by every test folder: the Docker engine, the CPU image and the CUDA stand-in images
built from this tree."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
CPU_IMAGE = "trainkit:latest-cpu"
CPU_RL_IMAGE = "trainkit:latest-cpu-rl"  # `build.py --cpu --rl`: opt-in (--cpu-rl), about 4 GB of vLLM's CPU stack
# CI's stand-in rows: the oldest and the default CUDA row, one arch (nvcc time grows with every arch).
STANDIN_ROWS = ("12.1", "12.8")
STANDIN_ARCH = "9.0"
RL_ROW = "rl"  # the online-RL row's stand-in (images/versions.toml's [standin.rl]): with --all-rows, or -k rl


STANDIN_FIXTURES = {"standin_image", "standin_default", "standin_build", "standin_row"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--standin", action="store_true",
                     help="also build and test the CUDA stand-in images of the oldest and the default row")  # fmt: skip
    parser.addoption("--all-rows", action="store_true",
                     help="build and test the stand-in image of every CUDA row (implies --standin)")  # fmt: skip
    parser.addoption("--cpu-rl", action="store_true",
                     help="also build the CPU flavor's online-RL image (build.py --cpu --rl: vLLM's CPU build) and "
                          "train GRPO with TRAIN_RL_ENGINE=vllm in it (tests/images/test_cpu_rl_image.py)")  # fmt: skip
    parser.addoption("--all-reshards", action="store_true",
                     help="also resume ZeRO-3 and FSDP runs on another process count (tests/trainer/"
                          "test_resume_nproc.py; about 3 minutes each on 2 cores)")  # fmt: skip
    parser.addoption("--row-image", metavar="X.Y=IMAGE",
                     help="run the row tests on this built image of CUDA row X.Y instead of a stand-in (the release "
                          "pipeline's real NGC images)")  # fmt: skip


# The edit-test loop's tier, `pytest -m fast` (docs/development.md has its measured time): the test files that need
# no Docker, no training run and no network. A file joins only if the tier stays under 3 minutes on 2 cores.
FAST_FILES = frozenset({
    "tests/test_layout.py", "tests/test_generated.py", "tests/test_release_workflow.py",
    "tests/images/test_matrix.py", "tests/images/test_standin_plan.py", "tests/images/test_cuda_auto.py",
    "tests/images/test_standin_toolkit.py",
    "tests/cluster/test_cluster_hostlist.py", "tests/cluster/test_one_rule.py", "tests/cluster/test_cluster_launch.py",
    "tests/cluster/test_cluster_secrets.py",
    "tests/bench/test_bench_parts.py", "tests/compose/test_compose_files.py", "tests/compose/test_run_mounts.py",
    "tests/trainer/test_resume_decide.py", "tests/trainer/test_rows_compat.py", "tests/trainer/test_speed_decisions.py",
    "tests/trainer/test_doctor_driver.py", "tests/trainer/test_training_arguments_fields.py", "tests/test_commands.py",
    "tests/test_types.py", "tests/test_methods.py", "tests/test_settings_homes.py",
})  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`fast` on the tier's tests (never on a docker or slow one). Stand-in images are opt-in (`--standin`,
    `--all-rows`): a cold one compiles for about 25 minutes here."""
    for item in items:
        heavy = item.get_closest_marker("docker") or item.get_closest_marker("slow")
        if item.path.relative_to(ROOT).as_posix() in FAST_FILES and not heavy:
            item.add_marker(pytest.mark.fast)
    if not (config.getoption("--standin") or config.getoption("--all-rows") or config.getoption("--row-image")):
        _deselect(config, items, STANDIN_FIXTURES)
    if not config.getoption("--cpu-rl"):
        _deselect(config, items, {"cpu_rl_image"})
    _engine_files_last(items)


# Each test's CPU seconds (this process and the children it waited for: a trainer subprocess, pip, a build's client;
# not the Docker engine's own work), beside its wall seconds in the JUnit XML (tests/run.sh's build/test-logs/*.xml):
# what a test costs on a machine whose other core is busy with the other stream. Fixtures it set up are counted on it.
_CPU_KEY = pytest.StashKey[float]()


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    item.stash[_CPU_KEY] = _cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield
    if _CPU_KEY in item.stash:
        item.user_properties.append(("cpu_s", round(_cpu_seconds() - item.stash[_CPU_KEY], 2)))


def _deselect(config: pytest.Config, items: list[pytest.Item], fixtures: set[str]) -> None:
    """Leave out the tests that use any of `fixtures` (an opt-in image)."""
    chosen = [item for item in items if fixtures & set(getattr(item, "fixturenames", ()))]
    if chosen:
        config.hook.pytest_deselected(items=chosen)
        items[:] = [item for item in items if item not in chosen]


def _needs_the_cpu_image(item: pytest.Item) -> bool:
    return "cpu_image" in getattr(item, "fixturenames", ())


def _needs_the_engine(item: pytest.Item) -> bool:
    return _needs_the_cpu_image(item) or item.get_closest_marker("docker") is not None


def _engine_files_last(items: list[pytest.Item]) -> None:
    """The files that need the CPU image or the engine run last (each file's order kept), so the image's build,
    started in the background when collection ends, overlaps every test before them instead of holding up the
    first."""
    engine_files = {item.path for item in items if _needs_the_engine(item)}
    items.sort(key=lambda item: item.path in engine_files)


# The CPU image's build, started in the background once collection knows a test needs it (`cpu_image` waits);
# its output goes to a file, read back only when it fails.
_cpu_build: subprocess.Popen | None = None
_cpu_build_log = tempfile.TemporaryFile()  # noqa: SIM115 (open for the whole session)


def _start_cpu_build() -> subprocess.Popen:
    global _cpu_build
    _cpu_build = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "build.py"), "--cpu"], cwd=ROOT,
                                  stdout=_cpu_build_log, stderr=subprocess.STDOUT)  # fmt: skip
    return _cpu_build


def pytest_collection_finish(session: pytest.Session) -> None:
    needed = any(_needs_the_cpu_image(item) for item in session.items)
    if session.config.getoption("--collect-only") or not needed:
        return
    try:
        if subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode != 0:
            return
    except (OSError, subprocess.TimeoutExpired):
        return  # no engine: `docker_client` skips (or fails on CI) with the reason
    _start_cpu_build()


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _cpu_build is not None and _cpu_build.poll() is None:  # the session ended (-x, Ctrl-C) before a test needed it
        _cpu_build.terminate()
        _cpu_build.wait(timeout=60)


def standin_rows(config: pytest.Config) -> list[str]:
    if config.getoption("--row-image"):
        row, _, image = config.getoption("--row-image").partition("=")
        _given_images[row] = image
        return [row]
    if not config.getoption("--all-rows"):
        return list(STANDIN_ROWS)
    return list(tomllib.loads((ROOT / "images" / "versions.toml").read_text()).get("standin", {}))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "standin_row" in metafunc.fixturenames:
        metafunc.parametrize("standin_row", standin_rows(metafunc.config), scope="session")


def _engine_missing(reason: str) -> None:
    """No engine: a failure on CI (env CI set), a skip with the reason elsewhere."""
    if os.environ.get("CI"):
        pytest.fail(f"Docker engine required on CI: {reason}")
    pytest.skip(f"no Docker engine: {reason}")


@pytest.fixture(scope="session")
def docker_client():
    """A docker SDK client for the local engine (skips, or fails on CI, without one)."""
    try:
        import docker

        client = docker.from_env()
        client.ping()
    except Exception as exc:
        _engine_missing(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    return client


@pytest.fixture(scope="session")
def cpu_image(docker_client) -> str:
    """`trainkit:latest-cpu`, built once per session from this tree by `scripts/build.py --cpu`, in the background
    from the end of collection (a warm rebuild when only the trainer changed takes seconds)."""
    build = _cpu_build or _start_cpu_build()  # not started by collection where the engine came up later
    returncode = build.wait(timeout=3600)
    if returncode != 0:
        _cpu_build_log.seek(0)
        output = _cpu_build_log.read().decode(errors="replace")[-9000:]
        pytest.fail(f"`scripts/build.py --cpu` failed (exit {returncode}):\n{output}")
    return CPU_IMAGE


@pytest.fixture(scope="session")
def cpu_rl_image(docker_client) -> str:
    """`trainkit:latest-cpu-rl`, built once per session from this tree by `scripts/build.py --cpu --rl` (opt-in:
    --cpu-rl; its CPU base is the CPU image's)."""
    build = subprocess.run([sys.executable, str(ROOT / "scripts" / "build.py"), "--cpu", "--rl"], cwd=ROOT,
                           capture_output=True, text=True, timeout=5400)  # fmt: skip
    if build.returncode != 0:
        pytest.fail(f"`scripts/build.py --cpu --rl` failed (exit {build.returncode}):\n{build.stdout[-3000:]}\n"
                    f"{build.stderr[-6000:]}")  # fmt: skip
    return CPU_RL_IMAGE


_standin_builds: dict[str, subprocess.CompletedProcess] = {}
_given_images: dict[str, str] = {}  # --row-image: row -> an image built elsewhere


def row_slug(row: str) -> str:
    """What a stand-in's tags and record name its row by: `cu128` for CUDA 12.8, `rl` for the online-RL row."""
    return row if row == RL_ROW else "cu" + row.replace(".", "")


def build_standin(cuda: str, *extra: str) -> subprocess.CompletedProcess:
    """`scripts/build.py --cuda X.Y --standin --arch-list 9.0 ...` (`--rl --standin` for the online-RL row) from
    this tree."""
    row = ["--rl"] if cuda == RL_ROW else ["--cuda", cuda]
    argv = [sys.executable, str(ROOT / "scripts" / "build.py"), *row, "--standin",
            "--arch-list", STANDIN_ARCH]  # fmt: skip
    return subprocess.run([*argv, *extra], cwd=ROOT, capture_output=True, text=True, timeout=5400)


@pytest.fixture(scope="session")
def standin_image(docker_client, standin_row: str) -> str:
    """The stand-in image of one CUDA row (`trainkit:latest-cuXY-standin`), built at most once per session; its
    base is built once and then reused by tag, and unchanged layers come from the cache."""
    return standin_image_of(standin_row)


@pytest.fixture(scope="session")
def standin_default(docker_client) -> str:
    """The default row's (12.8) stand-in image, shared with `standin_image`'s build of it."""
    return standin_image_of("12.8")


@pytest.fixture(scope="session")
def standin_build():
    """`build_standin(cuda, *extra_args)`: run build.py for a stand-in row with extra arguments (e.g. a test tag)."""
    return build_standin


def standin_image_of(standin_row: str) -> str:
    if standin_row in _given_images:
        return _given_images[standin_row]
    if standin_row not in _standin_builds:
        _standin_builds[standin_row] = build_standin(standin_row)
    proc = _standin_builds[standin_row]
    if proc.returncode != 0:
        pytest.fail(f"the CUDA {standin_row} stand-in build failed (exit {proc.returncode}):\n"
                    f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")  # fmt: skip
    return f"trainkit:latest-{row_slug(standin_row)}-standin"
