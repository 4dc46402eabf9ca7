"""TRAIN_RL_ENGINE=vllm in the jobs: TRL's vLLM server in its own container beside the trainer.

The server's start script is defined here once: compose's `vllm` service carries the same text (its test holds them
equal), the Slurm job runs it as a step of its own on one node of the allocation, and Kubernetes runs it as a
Deployment with a Service. The image is NVIDIA's vLLM image from images/versions.toml's [vllm], by digest once one is
recorded there. None of this was run here (no GPU, no NGC, no cluster): docs/cluster.md says what is proven.
"""

from __future__ import annotations

import argparse

from cluster_quote import sh
from errors import UserError
from matrix import VllmServer, load

PORT = 8000


def server(matrix_vllm: VllmServer | None = None) -> VllmServer:
    found = matrix_vllm or load().vllm
    if found is None:
        raise UserError("images/versions.toml has no [vllm] table: the server image is not pinned")
    return found


def serve_script(low: str, high: str) -> str:
    """The server container's command (sh -c): TRAIN_MODEL set, the image's vLLM inside TRL's range [low, high]
    (exit 2 otherwise), then `vllm serve` with what TRL's client needs (the weight-transfer endpoints, NCCL weight
    sync, the sampling logprobs). TRAINKIT_VLLM_ARGS: more `vllm serve` options."""
    check = "\n".join([
        "import sys, vllm",
        'r = lambda v: tuple(int(x) for x in v.split("+")[0].split(".")[:3] if x.isdigit())',
        f'ok = r("{low}") <= r(vllm.__version__) <= r("{high}")',
        f'print(f"vllm: vLLM {{vllm.__version__}}, TRL supports {low} to {high}", file=sys.stderr)',
        "sys.exit(0 if ok else 2)",
    ])  # fmt: skip
    return "\n".join([
        '[ -n "${TRAIN_MODEL}" ] || { echo "vllm: TRAIN_MODEL is not set (the .env names the model to serve)" >&2; '
        "exit 2; }",
        f"python3 -c {sh(check)} || {{ echo \"vllm: this image's vLLM is outside TRL's range; pick another tag\" >&2; "
        "exit 2; }",
        "export VLLM_SERVER_DEV_MODE=1  # the weight-transfer endpoints TRL's client calls",
        f'exec vllm serve "${{TRAIN_MODEL}}" --host 0.0.0.0 --port {PORT} --weight-transfer-config '
        "'{\"backend\": \"nccl\"}' --logprobs-mode processed_logprobs --max-logprobs -1 ${TRAINKIT_VLLM_ARGS:-}",
        "",
    ])  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("online RL (TRAIN_RL_ENGINE=vllm)")
    group.add_argument("--vllm-server", action="store_true",
                       help="start TRL's vLLM generation server beside the trainer (Slurm: one more node; "
                            "Kubernetes: a Deployment and Service) and point TRAIN_RL_VLLM_URL at it")  # fmt: skip
    group.add_argument("--vllm-image", help="the server image (default: images/versions.toml's [vllm])")
    group.add_argument("--vllm-gpus", type=int, default=1, help="GPUs of the server (its --tensor-parallel-size)")
    group.add_argument("--vllm-require-digest", action="store_true",
                       help="refuse a server image that is not pinned by digest (IMAGE@sha256:...)")  # fmt: skip


def check_args(args: argparse.Namespace) -> None:
    """Fills --vllm-image; refuses an unpinned one under --vllm-require-digest and a server with no GPU."""
    if not args.vllm_server:
        return
    args.vllm_image = args.vllm_image or server().image
    if args.vllm_require_digest and "@sha256:" not in args.vllm_image:
        raise UserError(f"--vllm-require-digest: {args.vllm_image} is not pinned by digest. Pull it once, then write "
                        "its digest into images/versions.toml's [vllm] server_digest, or pass --vllm-image "
                        "IMAGE@sha256:...")  # fmt: skip
    if args.vllm_gpus < 1:
        raise UserError(f"--vllm-gpus {args.vllm_gpus}: the vLLM server needs at least one GPU")


def script(args: argparse.Namespace) -> str:
    low, high = server().trl_range
    extra = f"--tensor-parallel-size {args.vllm_gpus} " if args.vllm_gpus > 1 else ""
    return serve_script(low, high).replace("${TRAINKIT_VLLM_ARGS:-}", extra + "${TRAINKIT_VLLM_ARGS:-}")


# ---- Slurm -------------------------------------------------------------------------------------------------------


def slurm_server_block(args: argparse.Namespace, container: list[str]) -> list[str]:
    """The server step on the allocation's first node (in the background), a wait until its port answers, and
    TRAIN_RL_VLLM_URL for the training step, which runs on the other nodes. `container`: the words that run a
    command in args.vllm_image (pyxis's or Apptainer's)."""
    words = ["srun", "--nodes=1", "--ntasks=1", '--nodelist="$TRAINKIT_VLLM_NODE"', f"--gpus={args.vllm_gpus}",
             *map(sh, container), "/bin/sh", "-c", sh(script(args))]  # fmt: skip
    return [
        "",
        "# TRL's vLLM generation server: its own step on the first node; the trainer runs on the others.",
        'TRAINKIT_VLLM_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        " \\\n    ".join(words) + " &",
        "TRAINKIT_VLLM_STEP=$!",
        f'export TRAIN_RL_VLLM_URL="http://$TRAINKIT_VLLM_NODE:{PORT}"',
        "for _ in $(seq 180); do  # up to 30 minutes for the model to load",
        f'    (exec 3<>"/dev/tcp/$TRAINKIT_VLLM_NODE/{PORT}") 2>/dev/null && break',
        '    kill -0 "$TRAINKIT_VLLM_STEP" 2>/dev/null || { echo "trainkit: the vLLM server step ended" >&2; exit 2; }',
        "    sleep 10",
        "done",
    ]


def training_step_words(args: argparse.Namespace) -> list[str]:
    """srun options that keep the training step off the server's node."""
    return [f"--nodes={args.nodes}", '--exclude="$TRAINKIT_VLLM_NODE"'] if args.vllm_server else []


# ---- Kubernetes --------------------------------------------------------------------------------------------------


def k8s_documents(args: argparse.Namespace, pod_spec: dict) -> list[dict]:
    """A Deployment (one pod: the server, with the job's volumes and env) and the Service the trainer reaches it
    by; `pod_spec` is the trainer's pod spec, whose security, placement and pull settings the server shares."""
    name = f"{args.job_name}-vllm"
    metadata = {"name": name, **({"namespace": args.namespace} if args.namespace else {})}
    trainer = pod_spec["containers"][0]
    container = {
        "name": "vllm",
        "image": args.vllm_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", script(args)],
        "env": [e for e in trainer["env"] if e["name"] != "TRAIN_RL_VLLM_URL"],
        "ports": [{"name": "http", "containerPort": PORT}],
        "readinessProbe": {"tcpSocket": {"port": PORT}, "periodSeconds": 10},
        "resources": {"limits": {"nvidia.com/gpu": args.vllm_gpus}},
        "volumeMounts": trainer["volumeMounts"],
    }
    spec = {k: v for k, v in pod_spec.items() if k not in ("containers", "terminationGracePeriodSeconds")}
    labels = {"app": name}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {**spec, "containers": [container]}}},
    }  # fmt: skip
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {"selector": labels, "ports": [{"name": "http", "port": PORT, "targetPort": PORT}]},
    }
    return [deployment, service]


def k8s_url(args: argparse.Namespace) -> str:
    return f"http://{args.job_name}-vllm:{PORT}"
