"""Cluster jobs from the same image and .env: Slurm with pyxis/enroot, Slurm with Apptainer, Kubernetes PyTorchJob.

    python scripts/cluster.py slurm-pyxis     --nodes 4 --gpus-per-node 8 --env-file .env \\
        --data /lustre/data --output /lustre/runs/exp1 -o job.sbatch
    python scripts/cluster.py slurm-apptainer --nodes 2 --gpus-per-node 8 --sif trainkit.sif ... -o job.sbatch
    python scripts/cluster.py k8s --nodes 2 --gpus-per-node 8 --data-pvc data --output-pvc runs -o job.yaml

Every node runs the image's entrypoint (`train`), whose launcher reads the scheduler's variables
(SLURM_* or the PyTorchJob's PET_*) and starts torchrun with one process per GPU. The .env's settings
are copied into the job; its secrets (trainer/secrets.py's rule: by name, like HF_TOKEN, or by value, like the
password in HF_ENDPOINT=https://user:pass@mirror) never are: a Slurm job reads them from JOB_FILE.secrets
(mode 600, written next to it), Kubernetes takes them from a Secret. Job files are written readable by their owner
only (the script 700, the manifest 600).
"""

from __future__ import annotations

import host_tools  # noqa: F401  # isort: skip  (first: missing host tools are one line, not a traceback)
import argparse
import itertools
import os
import sys
from pathlib import Path

import cluster_k8s
import cluster_slurm
import cluster_vllm
from cluster_env import EnvFile, read_env
from cluster_quote import comment, identifier, image_reference, sh
from errors import UserError, exit_missing_package, exit_on_user_error

try:
    from trainer.config import parse_settings
    from trainer.errors import ConfigError
    from trainer.secrets import is_secret_name
except ModuleNotFoundError as missing:
    exit_missing_package(missing)

TARGETS = ("slurm-pyxis", "slurm-apptainer", "k8s")


def sweep_combinations(args: argparse.Namespace, env: EnvFile) -> list[dict[str, str]]:
    """--sweep NAME=V1,V2 (repeatable): every combination, each checked with the .env's settings like the .env."""
    axes: list[list[tuple[str, str]]] = []
    for item in args.sweep:
        name, sep, values = item.partition("=")
        if not sep or not name or not values:
            raise UserError(f"--sweep {item!r}: use NAME=VALUE1,VALUE2, e.g. TRAIN_LR=1e-4,3e-4.")
        if is_secret_name(name):
            raise UserError(f"--sweep {name}: a secret cannot be swept (it would be written into the job file).")
        axes.append([(name, value) for value in values.split(",")])
    combos = [dict(combo) for combo in itertools.product(*axes)] if axes else []
    for combo in combos:
        try:
            parse_settings({**env.settings, **combo})
        except ConfigError as exc:
            raise UserError(f"--sweep {combo}: {exc.message}") from None
    return combos


def secrets_path(args: argparse.Namespace) -> Path:
    """Where a Slurm job's secrets go: JOB_FILE.secrets, or JOB_NAME.secrets here when the job goes to stdout."""
    return (Path(f"{args.out}.secrets") if args.out else Path(f"{args.job_name}.secrets")).resolve()


def write_private(path: Path, text: str, mode: int) -> None:
    """Write `text` to a file only its owner may read, from its first byte on (also when it existed before)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fh.fileno(), mode)
        fh.write(text)


def write_secrets_file(env: EnvFile, path: Path) -> None:
    """`export NAME='value'` lines from the one .env parser, readable by the user only; bash reads them back exactly."""
    lines = [f"export {identifier(name, str(env.path))}={sh(value)}" for name, value in env.secrets.items()]
    write_private(
        path, f"# secrets of a trainkit job, from {comment(env.path)}; keep private\n" + "\n".join(lines) + "\n", 0o600
    )


# ---------------------------------------------------------------- CLI


def default_image() -> str:
    try:
        from matrix import default_image as matrix_default
    except ImportError as exc:
        raise UserError(f"cannot read the default image from scripts/matrix.py ({exc}); pass --image.") from None
    return matrix_default(gpu=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", choices=TARGETS)
    parser.add_argument("--nodes", type=int, default=1, help="nodes (Slurm) or pods (Kubernetes)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node; 0 for CPU nodes")
    parser.add_argument("--image", help="image reference the cluster can pull (default: scripts/matrix.py's)")
    parser.add_argument("--env-file", type=Path, help="the .env with TRAIN_* settings (default: ./.env if present)")
    parser.add_argument("--job-name", default="trainkit")
    parser.add_argument("--max-restarts", type=int, help="TRAIN_MAX_RESTARTS: torchrun restarts of the workers")
    parser.add_argument("-o", "--out", type=Path, help="write here instead of stdout")
    slurm = parser.add_argument_group("Slurm")
    for name, what in [("data", "read-only, /data"), ("models", "read-only, /models"), ("output", "/output"),
                       ("cache", "/cache")]:  # fmt: skip
        slurm.add_argument(f"--{name}", help=f"shared folder on the cluster ({what})")
    slurm.add_argument("--partition")
    slurm.add_argument("--account")
    slurm.add_argument("--time", help="time limit, e.g. 24:00:00")
    slurm.add_argument("--qos")
    slurm.add_argument("--constraint", help="node features, e.g. h100")
    slurm.add_argument("--exclude", help="nodes to avoid, e.g. gpu[07-08]")
    slurm.add_argument("--reservation")
    slurm.add_argument("--dependency", help="e.g. singleton (one job of this name at a time) or afterany:JOBID")
    slurm.add_argument("--gres", action="store_true", help="ask for GPUs with --gres=gpu:N (older Slurm)")
    slurm.add_argument(
        "--cpus-per-task", type=int,
        help="CPUs per node (Slurm; default: whole nodes with --exclusive) or CPU request per pod",
    )  # fmt: skip
    slurm.add_argument(
        "--mem", help="memory per node (Slurm; default 0, all, with --exclusive) or memory request per pod (200Gi)"
    )
    slurm.add_argument("--sif", help="Apptainer image file (default: docker://IMAGE)")
    slurm.add_argument(
        "--sweep", action="append", default=[], metavar="NAME=V1,V2",
        help="a job array over these values (repeat for every combination); task i writes to OUTPUT/sweep-i",
    )  # fmt: skip
    slurm.add_argument(
        "--stop-signal-s", type=int, default=300,
        help="seconds before the time limit to checkpoint and requeue (the checkpoint must fit)",
    )  # fmt: skip
    slurm.add_argument("--log", default="trainkit-%j.out", help="Slurm output file pattern (appended on requeue)")
    cluster_k8s.add_arguments(parser)
    cluster_vllm.add_arguments(parser)
    return parser.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    if args.nodes < 1:
        raise UserError(f"--nodes {args.nodes}: need at least 1.")
    if args.gpus_per_node < 0:
        raise UserError(f"--gpus-per-node {args.gpus_per_node}: use 0 (CPU) or more.")
    if args.target.startswith("slurm") and not args.output:
        raise UserError("--output PATH is required for Slurm: a folder on a filesystem every node shares.")
    if args.target == "k8s" and not args.output_pvc:
        raise UserError("--output-pvc NAME is required for Kubernetes: a ReadWriteMany claim for /output.")
    if args.sif and not args.sif.endswith(".sif"):
        raise UserError(f"--sif {args.sif}: expected an Apptainer image file ending in .sif.")
    if args.sweep and args.target == "k8s":
        raise UserError("--sweep makes a Slurm job array; for Kubernetes, write one manifest per value.")
    if args.image is None and not (args.target == "slurm-apptainer" and args.sif):
        args.image = default_image()
    if args.image is not None:
        image_reference(args.image)
    if args.env_file is None and Path(".env").is_file():
        args.env_file = Path(".env")


def generate(args: argparse.Namespace, env: EnvFile) -> str:
    if args.target == "k8s":
        return cluster_k8s.k8s_manifest(args, env)
    generator = cluster_slurm.slurm_pyxis if args.target == "slurm-pyxis" else cluster_slurm.slurm_apptainer
    text = generator(args, env, secrets_path(args))
    if env.secrets:
        write_secrets_file(env, secrets_path(args))
        print(f"wrote {secrets_path(args)} (mode 600): the job's secrets, read at run time", file=sys.stderr)
    if not args.cache:
        print(f"/cache: {cluster_slurm.cache_dir(args)} (no --cache given; under the output folder)", file=sys.stderr)
    return text


def pin_image(args: argparse.Namespace) -> None:
    """A tag like latest-cu128 moves, and nodes that cached an older pull keep running it: write the registry's
    digest into the job instead, so every node and every restart runs the same bytes."""
    if not args.image or "@sha256:" in args.image or args.image.endswith((".sqsh", ".squashfs")):
        return
    try:
        import registry
        from engine import connect

        pinned = registry.resolve_digest(connect(), args.image)
    except UserError as exc:
        print(f"note: {args.image} stays a tag in the job (no digest: {str(exc).splitlines()[0]}); pin it by "
              "passing IMAGE@sha256:... (`python scripts/build.py --push` prints it).", file=sys.stderr)  # fmt: skip
        return
    print(f"pinned {args.image} to {pinned}", file=sys.stderr)
    args.image = pinned


def image_identity(args: argparse.Namespace) -> dict[str, str]:
    """TRAINKIT_IMAGE (the reference the job runs) and TRAINKIT_IMAGE_DIGEST when it is pinned, passed into the job
    as scripts/run.py passes them: what the run's provenance.json records as its image."""
    image = args.image or getattr(args, "sif", None)
    if not image:
        return {}
    digest = image.split("@", 1)[1] if "@sha256:" in image else None
    return {"TRAINKIT_IMAGE": image, **({"TRAINKIT_IMAGE_DIGEST": digest} if digest else {})}


def vllm_settings(args: argparse.Namespace, env: EnvFile) -> None:
    """--vllm-server is for TRAIN_RL_ENGINE=vllm; on Kubernetes the trainer reaches the server by its Service (Slurm's
    job exports TRAIN_RL_VLLM_URL once it knows the server's node)."""
    cluster_vllm.check_args(args)
    engine = env.settings.get("TRAIN_RL_ENGINE", "transformers")
    if args.vllm_server and engine != "vllm":
        source = env.path or "the settings"
        raise UserError(f"--vllm-server starts a generation server for TRAIN_RL_ENGINE=vllm, but {source} set "
                        f"TRAIN_RL_ENGINE={engine}; set TRAIN_RL_ENGINE=vllm there, or drop the option")  # fmt: skip
    if args.vllm_server and args.target == "k8s":
        env.settings["TRAIN_RL_VLLM_URL"] = cluster_vllm.k8s_url(args)


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check_args(args)
    env = read_env(args.env_file)
    args.sweep_combinations = sweep_combinations(args, env)
    if not (args.target == "slurm-apptainer" and args.sif):
        pin_image(args)
    env.settings.update(image_identity(args))
    vllm_settings(args, env)
    text = generate(args, env)
    if args.out:
        write_private(args.out, text, 0o700 if args.target.startswith("slurm") else 0o600)
        kept_out = ", ".join(env.secrets) or "none"
        print(f"wrote {args.out} ({args.target}); secrets kept out of it: {kept_out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
