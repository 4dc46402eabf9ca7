"""What the trackers read from the environment, set before Transformers builds their callbacks; no torch.

- W&B: files under OUTPUT_DIR/wandb (WANDB_DIR). Without WANDB_API_KEY (and without WANDB_MODE) it runs offline:
  air-gapped clusters sync later with `wandb sync OUTPUT_DIR/wandb/offline-run-*`. Online, the server
  (WANDB_BASE_URL, default api.wandb.ai) must answer at start, else exit 2.
- MLflow: MLFLOW_TRACKING_URI (a server, checked at start; unset: MLflow's file store OUTPUT_DIR/mlruns) and
  MLFLOW_EXPERIMENT_NAME (default trainkit). Credentials in the URI (http://user:pass@host) move to MLflow's own
  MLFLOW_TRACKING_USERNAME/PASSWORD, so the URI MLflow prints ("View run at") and records holds none. A server that
  goes away later is logged once and dropped (trainer.trackers.outage).
- A resumed run continues its tracker runs: their ids are kept in OUTPUT_DIR/trackers.json and in every checkpoint's
  marker (`trackers`), and handed back as WANDB_RUN_ID (+ WANDB_RESUME=allow) and MLFLOW_RUN_ID.
Variables the user set win (setdefault), except the run ids of a resumed run.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Protocol

from trainer.errors import ConfigError
from trainer.secrets import mask_url_credentials, mask_value

log = logging.getLogger("trainer")

STATE_FILE = "trackers.json"
WANDB_DEFAULT_URL = "https://api.wandb.ai"
DEFAULT_PROJECT = "trainkit"
REACH_TIMEOUT_S = 10.0
# MLflow's client retries a failed request 7 times with a growing wait (about 4 minutes), with training stopped
# meanwhile: a server gone mid-run costs the run seconds with these, once (trainer.trackers.outage drops it).
MLFLOW_CLIENT_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                          "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}  # fmt: skip


class _Decided(Protocol):
    """A decision (trainer.config.decision.Decision): the value decided."""

    @property
    def value(self) -> Any: ...


class _Decisions(Protocol):
    """The decisions the tags name (trainer.config.decision.Decisions)."""

    @property
    def precision(self) -> _Decided: ...
    @property
    def nproc_per_node(self) -> _Decided: ...
    @property
    def lora(self) -> _Decided: ...
    @property
    def quant(self) -> _Decided: ...
    @property
    def deepspeed(self) -> _Decided: ...
    @property
    def fsdp(self) -> _Decided: ...


class _Settings(Protocol):
    """The settings the trackers read (trainer.config.schema.TrainSettings)."""

    @property
    def output_dir(self) -> str: ...
    @property
    def model(self) -> str: ...


class ResolvedRun(Protocol):
    """What the trackers read of a resolved run: trainer.config's RunConfig, which this floor cannot import (config/
    imports trackers/)."""

    @property
    def settings(self) -> _Settings: ...
    @property
    def decisions(self) -> _Decisions: ...


def run_name(output_dir: str) -> str:
    """The tracker run's name: the output folder's name (its parent's too when it is a generic `output`)."""
    path = Path(output_dir).resolve()
    return f"{path.parent.name}-{path.name}" if path.name in ("output", "outputs") and path.parent.name else path.name


def run_tags(cfg: ResolvedRun) -> list[str]:
    """Tags from the resolved configuration: what a run list is filtered by."""
    d, s = cfg.decisions, cfg.settings
    model = s.model if s.model in ("tiny", "125m", "350m", "1b") else Path(s.model.split("@")[0]).name
    tags = ["trainkit", f"model:{model}", f"precision:{d.precision.value}", f"nproc:{d.nproc_per_node.value}"]
    if d.lora.value:
        tags.append("qlora" if d.quant.value != "none" else "lora")
    if d.deepspeed.value:
        tags.append(f"deepspeed:{d.deepspeed.value}")
    if d.fsdp.value != "none":
        tags.append(f"fsdp:{d.fsdp.value}")
    return tags


def previous_runs(output_dir: str, resuming: bool, recorded: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """The tracker runs a resumed run continues: what its checkpoint's marker recorded (trainer.config.resume reads it),
    else OUTPUT_DIR/trackers.json; none when the run starts from scratch."""
    if not resuming:
        return {}
    if recorded:
        return dict(recorded)
    try:
        found = json.loads((Path(output_dir) / STATE_FILE).read_text()).get("trackers")
    except (OSError, ValueError, AttributeError):
        return {}
    return found if isinstance(found, dict) else {}


def save_runs(output_dir: str, runs: dict[str, dict[str, str]]) -> None:
    """OUTPUT_DIR/trackers.json: the ids of this run's tracker runs (no credentials), written atomically."""
    target = Path(output_dir) / STATE_FILE
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"trackers": runs}, indent=2) + "\n")
    os.replace(tmp, target)


def prepare(
    cfg: ResolvedRun, trackers: list[str], resuming: bool, recorded: dict[str, dict[str, str]], main_process: bool
) -> dict[str, dict[str, str]]:
    """Set each chosen tracker's environment, check that it can be reached; returns the runs continued on resume."""
    out = cfg.settings.output_dir
    runs = previous_runs(out, resuming, recorded)
    if "wandb" in trackers:
        runs["wandb"] = _prepare_wandb(cfg, runs.get("wandb", {}), main_process)
    if "mlflow" in trackers:
        _prepare_mlflow(cfg, runs.get("mlflow", {}), main_process)
    if main_process and runs:
        save_runs(out, runs)
    return runs


def _prepare_wandb(cfg: ResolvedRun, previous: dict[str, str], main_process: bool) -> dict[str, str]:
    out = cfg.settings.output_dir
    env = os.environ
    env.setdefault("WANDB_DIR", out)
    env.setdefault("WANDB_PROJECT", DEFAULT_PROJECT)
    env.setdefault("WANDB_TAGS", ",".join(run_tags(cfg)))
    run_id = previous.get("run_id") or env.get("WANDB_RUN_ID") or uuid.uuid4().hex[:12]
    env["WANDB_RUN_ID"] = run_id
    env.setdefault("WANDB_RESUME", "allow")
    if "WANDB_MODE" not in env and not env.get("WANDB_API_KEY"):
        env["WANDB_MODE"] = "offline"
        if main_process:
            log.info("W&B: offline (no WANDB_API_KEY): run %s written to %s; upload it later with "
                     "`wandb sync %s`", run_id, Path(out) / "wandb", Path(out) / "wandb" / "offline-run-*")  # fmt: skip
    elif env.get("WANDB_MODE") not in ("offline", "disabled", "dryrun"):
        url = env.get("WANDB_BASE_URL", WANDB_DEFAULT_URL)
        _check_reachable("W&B", url, "/healthz", "set WANDB_MODE=offline to log offline")
        if main_process:
            log.info("W&B: run %s (project %s) at %s", run_id, env["WANDB_PROJECT"], mask_url_credentials(url))
    return {"run_id": run_id, "project": env["WANDB_PROJECT"]}


def _prepare_mlflow(cfg: ResolvedRun, previous: dict[str, str], main_process: bool) -> None:
    out = cfg.settings.output_dir
    env = os.environ
    if "MLFLOW_TRACKING_URI" not in env:
        # MLflow 3 keeps its file store (a plain folder, no database) in maintenance mode behind this switch; the
        # client (mlflow-skinny) has no SQL backend. `mlflow ui --backend-store-uri OUTPUT_DIR/mlruns` reads it.
        env["MLFLOW_TRACKING_URI"] = (Path(out).resolve() / "mlruns").as_uri()
        env.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = env["MLFLOW_TRACKING_URI"]
    if uri.startswith(("http://", "https://")):
        for name, value in MLFLOW_CLIENT_DEFAULTS.items():
            env.setdefault(name, value)
        bare, user, password = split_credentials(uri)
        if user is not None:  # MLflow's own basic-auth variables: the URI it prints and records holds no secret
            env["MLFLOW_TRACKING_URI"] = bare
            env.setdefault("MLFLOW_TRACKING_USERNAME", user)
            env.setdefault("MLFLOW_TRACKING_PASSWORD", password or "")
    env.setdefault("MLFLOW_EXPERIMENT_NAME", DEFAULT_PROJECT)
    keyed = [tag.split(":", 1) for tag in run_tags(cfg) if ":" in tag]
    env.setdefault("MLFLOW_TAGS", json.dumps({f"trainkit.{key}": value for key, value in keyed}))
    if previous.get("run_id"):
        env["MLFLOW_RUN_ID"] = previous["run_id"]
    if uri.startswith(("http://", "https://")):
        auth = (env.get("MLFLOW_TRACKING_USERNAME"), env.get("MLFLOW_TRACKING_PASSWORD"))
        _check_reachable("MLflow", uri, "/health", "check MLFLOW_TRACKING_URI", auth)
    where = mask_url_credentials(uri)
    if main_process:
        action = f"continuing run {previous['run_id']}" if previous.get("run_id") else "a new run"
        log.info("MLflow: %s in experiment %s at %s", action, env["MLFLOW_EXPERIMENT_NAME"], where)


def split_credentials(url: str) -> tuple[str, str | None, str | None]:
    """`url` without its userinfo, and the user name and password it held (percent-decoded); (url, None, None)
    when it holds none. `http://user:pass@host:port/path`: the host is `host`, never `user:pass@host`."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url, None, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, sep, password = userinfo.partition(":")
    bare = urllib.parse.urlunsplit(parts._replace(netloc=hostport))
    return bare, urllib.parse.unquote(user), urllib.parse.unquote(password) if sep else None


def _check_reachable(tracker: str, base: str, path: str, hint: str, auth: tuple[str | None, str | None] = (None, None)
                     ) -> None:  # fmt: skip
    """Exit 2 (ConfigError) when the tracker's server does not answer; any HTTP answer but 401/403 counts. Credentials
    in `base` (or `auth`) go in an Authorization header, never into the host name; messages show them masked."""
    shown = mask_url_credentials(base)
    bare, user, password = split_credentials(base)
    user, password = (user, password) if user is not None else auth
    request = urllib.request.Request(bare.rstrip("/") + path, method="GET")
    if user is not None:
        token = base64.b64encode(f"{user}:{password or ''}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        urllib.request.urlopen(request, timeout=REACH_TIMEOUT_S).close()
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise ConfigError(f"{tracker} at {shown} refused the credentials ({exc.code}); check them") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = mask_value(str(getattr(exc, "reason", exc)))
        raise ConfigError(
            f"TRAIN_REPORT_TO names {tracker}, but {shown} cannot be reached ({reason}); {hint}"
        ) from None
