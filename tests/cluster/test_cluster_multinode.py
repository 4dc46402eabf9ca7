"""Two nodes on one machine: two containers of the CPU image on a user-defined Docker network, each one node
of a torchrun c10d rendezvous (gloo), started only through the image's entrypoint (`train`) and the launcher's
NNODES / NODE_RANK / RDZV_ENDPOINT. `/output` is one host folder bound into both, as a cluster's shared
filesystem would be.

Reference for the loss curve: ONE process with the doubled per-device batch (8 = 2 nodes x 4). The sampler
draws the same seeded permutation in both runs; with two ranks each global batch is split into rank 0's and
rank 1's halves of those same 8 sequences, DDP averages the two half-batch gradients (= the full-batch mean
gradient, equal sizes), and the logged loss is the mean over ranks. So the curves agree up to floating-point
summation order (measured: ~1e-6 relative), while a different batch or data order moves the loss by >1e-2.
Tolerance: 1e-3 relative on every logged step.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from pathlib import Path

import pytest
import requests
from docker.errors import APIError

pytestmark = [pytest.mark.docker, pytest.mark.slow]

RDZV_PORT = 29400
RDZV_TIMEOUT_S = 40  # TRAIN_RDZV_TIMEOUT: how long a node waits for its peers after a restart
LOSS_RTOL = 1e-3
COMMON = {
    "TRAIN_MODEL": "tiny",
    "TRAIN_SEQ_LEN": "64",
    "TRAIN_LOG_STEPS": "1",
    "TRAIN_SEED": "42",
    "TRAIN_RDZV_TIMEOUT": str(RDZV_TIMEOUT_S),
    "OMP_NUM_THREADS": "1",
}


class Cluster:
    """Containers on one user-defined network; names double as hostnames so c10d finds its host node."""

    def __init__(self, client, image: str, output: Path) -> None:
        self.client, self.image, self.output = client, image, output
        self.tag = uuid.uuid4().hex[:8]
        self.network = client.networks.create(f"tk-mn-{self.tag}", driver="bridge")
        self.containers: list = []

    def name(self, rank: int) -> str:
        return f"tk-{self.tag}-node{rank}"

    def start(self, env: dict[str, str], name: str):
        container = self.client.containers.run(
            self.image, ["train"], name=name, hostname=name, network=self.network.name, detach=True,
            environment={**COMMON, **env}, user=f"{os.getuid()}:{os.getgid()}",
            volumes={str(self.output): {"bind": "/output", "mode": "rw"}},
        )  # fmt: skip
        self.containers.append(container)
        return container

    def start_nodes(self, env: dict[str, str]) -> list:
        for rank in (0, 1):  # a fresh pair (e.g. after a stop) reuses the names: remove the old ones first
            for old in self.client.containers.list(all=True, filters={"name": self.name(rank)}):
                old.remove(force=True)
        rdzv = {"NNODES": "2", "RDZV_ENDPOINT": f"{self.name(0)}:{RDZV_PORT}", "RDZV_ID": self.tag}
        return [self.start({**env, **rdzv, "NODE_RANK": str(rank)}, self.name(rank)) for rank in (0, 1)]

    def close(self) -> None:
        for container in self.containers:
            with contextlib.suppress(APIError):  # already gone
                container.remove(force=True)
        self.network.remove()


@pytest.fixture
def cluster(docker_client, cpu_image: str, tmp_path: Path):
    output = tmp_path / "output"
    output.mkdir()
    made = Cluster(docker_client, cpu_image, output)
    yield made
    made.close()


def wait_exit(container, timeout_s: float) -> int | None:
    """The container's exit code, or None while it still runs after `timeout_s` (the caller shows its log)."""
    try:
        return container.wait(timeout=timeout_s)["StatusCode"]
    except requests.exceptions.ConnectionError:  # the engine's wait outlived the client's read timeout
        return None


def logs(container) -> str:
    return container.logs().decode(errors="replace")


def metrics(output: Path) -> list[dict]:
    path = output / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def losses(rows: list[dict]) -> dict[int, float]:
    return {row["step"]: row["loss"] for row in rows}


def test_two_nodes_train_like_one_process_with_the_same_global_batch(
    cluster: Cluster, docker_client, cpu_image: str, tmp_path: Path
) -> None:
    steps = {"TRAIN_MAX_STEPS": "6", "TRAIN_SAVE_STEPS": "100"}
    nodes = cluster.start_nodes({**steps, "TRAIN_BATCH_SIZE": "4"})
    codes = [wait_exit(node, 600) for node in nodes]
    node_logs = [logs(node) for node in nodes]
    assert codes == [0, 0], node_logs[0][-3000:] + node_logs[1][-3000:]
    two_nodes = metrics(cluster.output)

    # the launcher decided a 2-node c10d rendezvous on each node, and every worker line names its rank
    for rank, text in enumerate(node_logs):
        assert f"2 node(s) x 1 process(es), node rank {rank}; c10d rendezvous at {cluster.name(0)}:{RDZV_PORT}" in text
        assert f"[rank{rank}]:" in text
    # only the main process writes metrics: each step once
    assert [row["step"] for row in two_nodes] == [1, 2, 3, 4, 5, 6]

    single_out = tmp_path / "single"
    single_out.mkdir()
    single = Cluster(docker_client, cpu_image, single_out)
    try:
        ref = single.start({**steps, "TRAIN_BATCH_SIZE": "8"}, f"tk-{single.tag}-single")
        assert wait_exit(ref, 600) == 0, logs(ref)[-3000:]
        assert "one process" in logs(ref)
    finally:
        single.close()
    reference = losses(metrics(single_out))
    assert sorted(reference) == [1, 2, 3, 4, 5, 6]
    for step, loss in losses(two_nodes).items():
        assert loss == pytest.approx(reference[step], rel=LOSS_RTOL), (step, loss, reference[step])
    worst = max(abs(loss - reference[step]) / reference[step] for step, loss in losses(two_nodes).items())
    print(f"2 nodes x batch 4 vs 1 process x batch 8: largest relative loss difference {worst:.1e} over 6 steps")


def test_stopping_one_node_ends_the_other_and_both_resume(cluster: Cluster) -> None:
    # Steps take ~0.2 s: the stop, sent once step 5 is logged, must land well before the last step (a stop after it
    # lets the run finish instead: test_stop_outcome.py).
    env = {"TRAIN_MAX_STEPS": "40", "TRAIN_SAVE_STEPS": "4", "TRAIN_BATCH_SIZE": "4"}
    node0, node1 = cluster.start_nodes(env)
    deadline = time.monotonic() + 600
    while len(metrics(cluster.output)) < 5:  # past the first checkpoint (step 4)
        assert time.monotonic() < deadline, logs(node0)[-3000:]
        assert node0.status != "exited", logs(node0)[-3000:]
        time.sleep(1)
        node0.reload()

    stopped_at = time.monotonic()
    node1.stop(timeout=120)  # SIGTERM: the trainer finishes its step and checkpoints, then exits 143
    code1 = wait_exit(node1, 10)
    # node0's workers stop at the same step (the stop flag is reduced across ranks); its torchrun then tries one
    # elastic restart and gives up when node1 does not rejoin within TRAIN_RDZV_TIMEOUT: bounded, non-zero.
    code0 = wait_exit(node0, RDZV_TIMEOUT_S + 120)
    ended_after_s = time.monotonic() - stopped_at
    text0, text1 = logs(node0), logs(node1)
    assert code1 == 143, text1[-3000:]
    assert code0 not in (None, 0), f"node0 exit {code0} (None: still running)\n" + text0[-3000:]
    assert ended_after_s < RDZV_TIMEOUT_S + 120
    print(f"node0 ended {ended_after_s:.1f}s after node1 was stopped (exit {code0}); node1 exit {code1}")

    complete = sorted(
        int(p.name.split("-")[1]) for p in cluster.output.glob("checkpoint-*") if (p / "trainkit_complete").exists()
    )
    last = complete[-1]
    assert last >= 5, complete  # the interrupt wrote its own checkpoint past the periodic one at step 4
    assert f"checkpoint-{last} written" in text0 + text1
    before = [row["step"] for row in metrics(cluster.output)]
    assert before == list(range(1, last + 1))

    node0, node1 = cluster.start_nodes(env)
    codes = [wait_exit(node, 600) for node in (node0, node1)]
    assert codes == [0, 0], logs(node0)[-3000:] + logs(node1)[-3000:]
    assert f"resume: continuing from /output/checkpoint-{last}" in logs(node0)
    assert [row["step"] for row in metrics(cluster.output)] == list(range(1, 41))
    assert (cluster.output / "final").is_dir()
