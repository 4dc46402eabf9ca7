"""Run trainkit in a container, the way `docker compose up train` does, from any folder.

    python scripts/run.py [options] COMMAND [ARGS...]       (a trainer command, below; train when none is given)
    python scripts/run.py [options] -- CMD [ARGS...]        (any command inside the image)
    python scripts/run.py [options] reproduce OUTPUT_DIR [--steps N] [--output NEW] [--allow-changed-data]
                                                            (run a finished run again in its image: reproduce.py)

run.py's options may also follow the trainer command; other arguments go to the command.

Mounts ./data (read-only) at /data, ./models (read-only) at /models, ./output at /output and the
`trainkit-cache` volume at /cache; runs as your user so ./output belongs to you; host IPC, memlock
unlimited, 64 MB stack (as the compose file). TRAIN_* settings come from ./.env (or --env-file) and
-e KEY=VALUE; HF_TOKEN and WANDB_API_KEY are passed from your environment at run time, never written anywhere.
`export /output/checkpoint-200 /output/merged`, `push /output/export org/name` and `diff /output/a /output/b`
name container paths.

Image rule (without --image): the GPU image (`trainkit:latest-cu<XY>`, the matrix default) when the
engine has the NVIDIA runtime and --gpus is not `none`, else the CPU image `trainkit:latest-cpu` (its online-RL
image `trainkit:latest-cpu-rl`, with vLLM's CPU build, where the run sets TRAIN_RL_ENGINE=vllm).

Ctrl-C stops the container gracefully (SIGTERM: the trainer writes a checkpoint, then exits 143);
a second Ctrl-C kills it. The exit code is the container's; 2 for a mistake on this side.
"""

from __future__ import annotations

import host_tools  # noqa: F401  # isort: skip  (first: missing host tools are one line, not a traceback)
import argparse
import contextlib
import os
import re
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import docker
import registry
import reproduce
import run_mounts
import run_serve
from devices import device_requests, rdma_passthrough
from docker.errors import APIError
from docker.types import Ulimit
from engine import connect
from errors import UserError, exit_missing_package, exit_on_user_error
from hf_token import add_token_file
from run_image import choose_image_and_gpus, ensure_image
from run_mounts import CACHE_VOLUME, volumes

try:
    from trainer.commands import BY_NAME, COMMANDS, DEFAULT, names
    from trainer.envfile import EnvFileError, read_env_file
    from trainer.secrets import mask_secrets
except ModuleNotFoundError as missing:
    exit_missing_package(missing)

HOST_PASSTHROUGH = ("HF_TOKEN", "WANDB_API_KEY")  # taken from this environment when set
STOP_GRACE_S = 600  # as compose's stop_grace_period: the interruption checkpoint must fit
FORWARDED = names(on_host=False)  # trainer commands run in the container as given; reproduce is run.py's own
STACK_BYTES = 67108864


@dataclass
class RunSpec:
    """Everything the container is created with."""

    image: str
    command: list[str]
    gpus: str
    user: str
    environment: dict[str, str]
    volumes: dict[str, dict[str, str]] = field(default_factory=dict)
    detach: bool = False
    stop_grace_s: int = STOP_GRACE_S
    memlock: int | None = None  # None: unlimited where the engine allows it, else the engine's own limit
    working_dir: str | None = None  # None: the image's own (/output)
    ports: dict[int, tuple[str, int]] = field(default_factory=dict)  # serve's: container port -> (host address, port)


def log(message: str) -> None:
    print(f"[run.py] {message}", file=sys.stderr, flush=True)


# --- arguments -----------------------------------------------------------------------------------


def options_parser(add_help: bool = True) -> argparse.ArgumentParser:
    """run.py's options (the command is added by the caller)."""
    parser = argparse.ArgumentParser(
        prog="run.py",
        allow_abbrev=False,
        description=__doc__,
        epilog="commands:\n" + "\n".join(f"  {c.name:<10} {c.help}" for c in COMMANDS),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=add_help,
    )
    parser.add_argument("--image", help="image to run, a tag or repo@sha256:... (default: see the image rule above)")
    parser.add_argument("--cuda", metavar="X.Y", help="with GPUs: the image of this CUDA row, or auto: the newest row "
                        "this host's driver can run (default: the matrix default)")
    parser.add_argument("--load", type=Path, metavar="FILE",
                        help="first `docker load` an archive made by `build.py --save` (sites without a registry)")
    parser.add_argument("--data", help="host folder or file mounted read-only at /data (default ./data if present)")
    parser.add_argument("--models", help="host folder mounted read-only at /models (default ./models if present)")
    parser.add_argument("--output", help="host folder mounted at /output (default ./output, created if missing)")
    parser.add_argument("--env-file", help="KEY=VALUE lines passed as environment (default ./.env if present)")
    parser.add_argument(
        "-e", "--env", action="append", default=[], metavar="KEY[=VALUE]",
        help="an environment variable for the container (KEY alone: take it from this environment)",
    )  # fmt: skip
    parser.add_argument("--hf-token-file", default=os.environ.get("TRAINKIT_HF_TOKEN_FILE") or None, metavar="FILE",
                        help="Hub token file, mounted read-only (HF_TOKEN_PATH): not in docker inspect")  # fmt: skip
    parser.add_argument("--gpus", default="auto", help="all, a count N, or none (default: all if the engine has GPUs)")
    parser.add_argument("--user", default=f"{os.getuid()}:{os.getgid()}", help="UID:GID to run as (default: you)")
    parser.add_argument("--cache-volume", help=f"named volume for /cache (default {CACHE_VOLUME})")
    parser.add_argument("--stop-timeout", type=int, default=STOP_GRACE_S, help="seconds for the checkpoint on stop")
    parser.add_argument(
        "--memlock", type=int, default=os.environ.get("TRAINKIT_MEMLOCK") or None,
        help="memlock limit in bytes, -1 unlimited (default: unlimited where the engine allows it, else the "
        "engine's own limit; env TRAINKIT_MEMLOCK)",
    )  # fmt: skip
    parser.add_argument("--detach", "-d", action="store_true", help="start the container and return")
    parser.add_argument(
        "--build-if-missing", action="store_true",
        help="build the chosen image with scripts/build.py when it is not there (first build takes a while)",
    )  # fmt: skip
    parser.set_defaults(from_record=False)  # reproduce of a run with run_mounts.RECORD_FILE: no ./data, ./.env defaults
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = options_parser()
    parser.add_argument(
        "command", nargs="?", default=DEFAULT, help=f"a command below ({DEFAULT} by default), or -- CMD ...",
    )  # fmt: skip
    head, tail = split_at_double_dash(argv)
    args, passed_on = parser.parse_known_args(head)
    args.command = container_command(args.command, passed_on, tail)
    if args.gpus not in ("auto", "all", "none") and not args.gpus.isdigit():
        raise UserError(f"--gpus {args.gpus!r}: use all, a number of GPUs, or none")
    if not re.fullmatch(r"\d+(:\d+)?", args.user):
        raise UserError(f"--user {args.user!r}: use UID or UID:GID (numbers), e.g. --user $(id -u):$(id -g)")
    return args


def split_at_double_dash(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """(run.py's part, the command after `--` or None)."""
    if "--" not in argv:
        return argv, None
    index = argv.index("--")
    return argv[:index], argv[index + 1 :]


def container_command(command: str, passed_on: list[str], tail: list[str] | None) -> list[str]:
    """The container's command: a trainer command with the arguments run.py does not know, or `-- CMD ...`.

    run.py's own options may come before or after the trainer command; `-- CMD ...` is passed as given.
    """
    if tail is not None:
        if not tail:
            raise UserError("nothing after `--`: give the command to run, e.g. `run.py -- python my_script.py`")
        if command != DEFAULT or passed_on:
            raise UserError(f"`-- {tail[0]} ...` runs a command of its own: drop {command!r} {' '.join(passed_on)}")
        return tail
    if command in names(on_host=True):
        raise UserError(f"{command} comes first: `run.py {command} {BY_NAME[command].usage} [options]`")
    if command not in FORWARDED:
        raise UserError(
            f"unknown command {command!r}: use {', '.join(FORWARDED)}, or `-- CMD ...` to run any command in the image"
        )
    return [command, *passed_on]


def env_file_path(args: argparse.Namespace) -> Path | None:
    """--env-file (it must exist), else ./.env where present (not for a recorded run: reproduce reads the run's)."""
    env_file = Path(args.env_file or ".env").expanduser()
    if args.env_file and not env_file.is_file():
        raise UserError(f"--env-file {args.env_file}: no such file")
    return env_file.resolve() if env_file.is_file() and (args.env_file or not args.from_record) else None


def environment(args: argparse.Namespace) -> dict[str, str]:
    """The container's environment: host passthrough (HF_TOKEN), then the env file, then -e options."""
    env = {name: os.environ[name] for name in HOST_PASSTHROUGH if os.environ.get(name)}
    env_file = env_file_path(args)
    if env_file:
        try:
            env.update(read_env_file(env_file))
        except EnvFileError as exc:
            raise UserError(str(exc)) from None
    for item in args.env:
        key, sep, value = item.partition("=")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise UserError(f"-e {item.split('=')[0]!r}: expected KEY=VALUE")
        if sep:
            env[key] = value
        elif key in os.environ:
            env[key] = os.environ[key]
    return env


def describe_env(env: dict[str, str]) -> str:
    """KEY=VALUE for the log: secrets' values and secret flags inside values (TRAIN_ARGS='--hub_token x') masked."""
    shown = [f"{k}={v}" for k, v in sorted(mask_secrets(env).items())]
    return " ".join(shown) or "(none)"


# --- running -------------------------------------------------------------------------------------


def create(client: docker.DockerClient, spec: RunSpec, memlock: int | None):
    """The container, created as docker-compose.yml would create it (labels never hold values).

    `memlock` None leaves the engine's own memlock limit in place."""
    api = client.api
    ulimits = [Ulimit(name="stack", soft=STACK_BYTES, hard=STACK_BYTES)]
    if memlock is not None:
        ulimits.append(Ulimit(name="memlock", soft=memlock, hard=memlock))
    try:
        host_config = api.create_host_config(
            binds=spec.volumes,
            ipc_mode="host",
            ulimits=ulimits,
            device_requests=device_requests(spec.gpus),
            port_bindings=spec.ports or None,
            **rdma_passthrough(),
        )
        created = api.create_container(
            spec.image,
            command=spec.command,
            user=spec.user,
            environment=spec.environment,
            labels={"org.trainkit.launcher": "run.py", "org.trainkit.command": spec.command[0]},
            stop_signal="SIGTERM",
            stop_timeout=spec.stop_grace_s,  # also what a plain `docker stop` waits
            working_dir=spec.working_dir,
            ports=list(spec.ports) or None,
            host_config=host_config,
        )
    except APIError as exc:
        raise UserError(f"cannot create the container: {exc.explanation or exc}") from None
    return client.containers.get(created["Id"])


class Interrupts:
    """First Ctrl-C (or SIGTERM): graceful `docker stop`; second Ctrl-C: kill."""

    def __init__(self, container, grace_s: int, command: str) -> None:
        self.container = container
        self.grace_s = grace_s
        self.count = 0
        self.doing = "the trainer writes a checkpoint" if command == "train" else f"{command} ends in order"

    def __call__(self, signum: int, _frame) -> None:
        self.count += 1
        if self.count == 1:
            log(f"stopping the container: {self.doing} (up to {self.grace_s} s); Ctrl-C again kills")
            action = lambda: self.container.stop(timeout=self.grace_s)  # noqa: E731
        else:
            log("killing the container")
            action = self.container.kill
        threading.Thread(target=self._quietly, args=(action,), daemon=True).start()

    @staticmethod
    def _quietly(action) -> None:
        with contextlib.suppress(APIError):  # it already exited
            action()


def stream_output(stream) -> None:
    """Copy the container's stdout/stderr (an attach stream with demux) here until it exits."""
    for out, err in stream:
        if out:
            sys.stdout.buffer.write(out)
            sys.stdout.buffer.flush()
        if err:
            sys.stderr.buffer.write(err)
            sys.stderr.buffer.flush()


MEMLOCK_REFUSED = "rlimit type 8"


def start(client: docker.DockerClient, spec: RunSpec, memlock: int | None):
    """Create and start the container; (container, attach stream or None when detached)."""
    container = create(client, spec, memlock)
    # Attached before the start, so that even a command that exits at once shows all its output.
    stream = None
    if not spec.detach:
        stream = client.api.attach(container.id, stdout=True, stderr=True, stream=True, logs=True, demux=True)
    try:
        container.start()
    except APIError:
        container.remove(force=True)
        raise
    return container, stream


def start_with_memlock_fallback(client: docker.DockerClient, spec: RunSpec):
    """Unlimited memlock (NVIDIA's advice for its containers) unless the engine cannot grant it: rootless or
    restricted engines refuse to raise it, and then the engine's own limit is the only one that can work."""
    if spec.memlock is not None:
        return start(client, spec, spec.memlock)
    try:
        return start(client, spec, -1)
    except APIError as exc:
        if MEMLOCK_REFUSED not in str(exc):
            raise
    log(
        "this engine cannot raise the memlock limit: running with its own limit (pinned-memory transfers may be slower)"
    )
    return start(client, spec, None)


def run(client: docker.DockerClient, spec: RunSpec) -> int:
    try:
        container, stream = start_with_memlock_fallback(client, spec)
    except APIError as exc:
        hint = ""
        if MEMLOCK_REFUSED in str(exc):
            hint = " (this engine may not raise the memlock limit, e.g. rootless Docker: use --memlock BYTES)"
        elif spec.gpus != "none":
            hint = " (this engine has no NVIDIA runtime: use --gpus none)"
        raise UserError(f"cannot start the container: {exc.explanation or exc}{hint}") from None
    if stream is None:
        log(f"started {container.name}: `docker logs -f {container.name}`, stop with `docker stop {container.name}`")
        return 0
    interrupts = Interrupts(container, spec.stop_grace_s, spec.command[0])
    previous = {sig: signal.signal(sig, interrupts) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        stream_output(stream)
        code = int(container.wait()["StatusCode"])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    container.remove(force=True)
    if interrupts.count:
        log(f"container stopped (exit {code})" + ("; run the same command again to resume from the checkpoint"
                                                  if spec.command[0] == "train" else ""))  # fmt: skip
    return code


def image_identity(client: docker.DockerClient, image: str) -> dict[str, str]:
    """TRAINKIT_IMAGE (the reference run), TRAINKIT_IMAGE_DIGEST (its registry digest, when it has one) and
    TRAINKIT_IMAGE_ID (the engine's id): what the run's provenance.json records as its image."""
    attrs = client.images.get(image).attrs
    digests = [d.split("@", 1)[1] for d in attrs.get("RepoDigests") or [] if "@" in d]
    return {"TRAINKIT_IMAGE": image, "TRAINKIT_IMAGE_ID": attrs["Id"],
            **({"TRAINKIT_IMAGE_DIGEST": digests[0]} if digests else {})}  # fmt: skip


def spec_from(args: argparse.Namespace, client: docker.DockerClient) -> RunSpec:
    if args.load:
        loaded = registry.load(client, args.load)
        log(f"loaded {', '.join(loaded) or 'an untagged image'} from {args.load}")
        args.image = args.image or (loaded[0] if loaded else None)
    env = environment(args)
    image, gpus = choose_image_and_gpus(args, client, log, vllm=env.get("TRAIN_RL_ENGINE") == "vllm")
    ensure_image(client, image, args.build_if_missing, log)
    env, mounts = {**env, **image_identity(client, image)}, volumes(args)
    add_token_file(args.hf_token_file, env, mounts)
    command, ports = run_serve.published(args.command) if args.command[0] == "serve" else (args.command, {})
    return RunSpec(
        image=image,
        command=command,
        ports=ports,
        gpus=gpus,
        user=args.user,
        environment=env,
        volumes=mounts,
        detach=args.detach,
        stop_grace_s=args.stop_timeout,
        memlock=args.memlock,
    )


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """(run.py's options before the command, the command and what follows it): `--data D reproduce OUT` too."""
    head, _ = split_at_double_dash(argv)
    parser = options_parser(add_help=False)
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    rest = parser.parse_known_args(head)[0].rest
    return argv[: len(head) - len(rest)], argv[len(head) - len(rest) :]


def reproduce_args(before: list[str], after: list[str]) -> tuple[argparse.Namespace, argparse.Namespace]:
    """`[options] reproduce OUTPUT_DIR ...`: reproduce's own arguments and run.py's options (--data, --env-file, -e,
    --image, --gpus, --user...) before or after it; the mounts the run recorded for those not given. All checked
    before the engine is asked anything."""
    wanted, rest = reproduce.parse_args(after)
    args = parse_args(before + rest)
    if args.command != ["train"]:
        raise UserError(f"reproduce: unknown argument(s) {' '.join(args.command)}; see `run.py reproduce --help`")
    if args.output is not None:
        raise UserError(f"--output {args.output} before reproduce: the new folder is reproduce's own option, "
                        f"`run.py reproduce {wanted.output_dir} --output NEW`")  # fmt: skip
    run_mounts.mount_again(wanted.output_dir, args, log)
    return wanted, args


def reproduce_spec(wanted: argparse.Namespace, args: argparse.Namespace, client: docker.DockerClient) -> RunSpec:
    """The recorded image and GPUs, OUTPUT_DIR read-only and NEW's parent at /output."""
    args.image = reproduce.choose_image(wanted.output_dir, args.image, client, log)
    args.gpus = reproduce.recorded_gpus(wanted.output_dir) if args.gpus == "auto" else args.gpus
    args.output = str(wanted.new.parent)
    spec = spec_from(args, client)
    spec.command = reproduce.container_command(wanted)
    spec.volumes.update(reproduce.mounts(wanted))
    # NEW's parent is often the project folder: as the working directory, its trainer/ would shadow the image's own
    # (python -m imports from the working directory first), and the re-run would not run the recorded code.
    spec.working_dir = "/"
    return spec


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    before, rest = split_command(argv)
    if rest[:1] == ["reproduce"]:
        wanted, args = reproduce_args(before, rest[1:])
        client = connect()
        spec = reproduce_spec(wanted, args, client)
    else:
        args = parse_args(argv)
        client = connect()
        spec = spec_from(args, client)
    mounts = ", ".join(f"{host} -> {m['bind']} ({m['mode']})" for host, m in spec.volumes.items())
    log(f"{spec.image}: {spec.command[0]} | gpus {spec.gpus} | user {spec.user} | {mounts}")
    log(f"environment: {describe_env(spec.environment)}")
    record = run_mounts.describe(spec.environment, spec.volumes, env_file_path(args))
    if spec.command[0] == "reproduce":  # the new run's record, once it is published
        return run_mounts.after(wanted.new, record, spec.user, run(client, spec))
    if spec.command[0] != "train":
        return run(client, spec)
    folder = run_mounts.run_folder(spec.environment, spec.volumes)
    with run_mounts.kept(folder, record, spec.user, spec.detach, log):
        return run(client, spec)


if __name__ == "__main__":
    sys.exit(main())
