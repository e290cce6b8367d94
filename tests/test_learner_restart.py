"""A learner world that loses a rank in the middle of an update comes back from its newest
checkpoint: real learner processes in a gloo world, a real coordinator, actor and Redis."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from procs import descendants, start_coordinator, wait_for
from states import assert_same

from rlmq.common.failpoints import EXIT_FAILPOINT, LEARNER_IN_UPDATE
from rlmq.common.service import EXIT_WORLD_LOST
from rlmq.common.transport import free_port
from rlmq.coordinator.store import RunStore
from rlmq.learners import checkpoint


def start_world(
    start_service: Any, coord: dict[str, Any], run_id: str, root: Path, tag: str, failpoint: str = "", *more: str
) -> list[Any]:
    master, experience = free_port(), [free_port(), free_port()]  # fixed, as a restarted rank needs
    return [
        start_service(
            f"learner-{rank}-{tag}",
            "learner",
            "--run",
            run_id,
            "--coordinator",
            f"tcp://127.0.0.1:{coord['control']}",
            "--broadcast",
            f"tcp://127.0.0.1:{coord['broadcast']}",
            "--rank",
            str(rank),
            "--world-size",
            "2",
            "--master-port",
            str(master),
            "--metrics-port",
            "-1",
            "--experience-port",
            str(experience[rank]),
            "--checkpoint-dir",
            str(root),
            *(["--failpoint", failpoint] if rank == 1 and failpoint else []),
            *more,
        )
        for rank in range(2)
    ]


@pytest.mark.parametrize("sync", ["gradients", "batch"])
def test_a_rank_lost_in_the_update_and_the_world_resumes_its_checkpoint_exactly(
    start_service: Any, tmp_path: Path, redis_url: str, run_id: str, sync: str
) -> None:
    """Rank 1 exits at the start of the update that follows the world's first checkpoint, while
    rank 0 waits for it in that update's collective (DDP's all-reduce in the backward pass, or the
    replicas' gather); rank 0 fails too. A new world resumes from checkpoint 1: with no actor left
    to feed it, the checkpoint it writes when stopped holds exactly the state it resumed (every
    member's parameters, Adam's moments and step counts)."""
    root = tmp_path / "checkpoints"
    coord = start_coordinator(
        start_service, tmp_path, redis_url, run_id, num_learners=2, checkpoint_interval_s=1.0, ppo={"sync": sync}
    )
    first = start_world(start_service, coord, run_id, root, "first", LEARNER_IN_UPDATE)
    actor = start_service(
        "actor",
        "actor",
        "--name",
        "actor-0",
        "--coordinator",
        f"tcp://127.0.0.1:{coord['control']}",
        "--broadcast",
        f"tcp://127.0.0.1:{coord['broadcast']}",
        "--metrics-port",
        "-1",
    )
    wait_for(lambda: not first[1].alive(), 120, "rank 1 to exit at its failpoint")
    assert first[1].process.returncode == EXIT_FAILPOINT, first[1].log()
    wait_for(lambda: not first[0].alive(), 60, "rank 0 to fail in the all-reduce")
    log = first[0].log()  # it failed in the update's collective, on the peer it lost
    assert first[0].process.returncode == EXIT_WORLD_LOST and "by peer" in log, log
    assert ("backward" if sync == "gradients" else "gather_along") in log, log
    actor.stop()
    written = [checkpoint.Checkpoints(root, rank, kept=3).latest() for rank in range(2)]
    assert written == [1, 1], written

    second = start_world(start_service, coord, run_id, root, "second")
    for rank, service in enumerate(second):
        wait_for(lambda s=service: "resumed from checkpoint 1" in s.log(), 90, f"rank {rank} to resume")
    second[0].process.terminate()  # rank 0 stops the world: every rank stops at the same iteration
    for service in second:
        assert service.process.wait(60) == 0, service.log()
    resumed = [checkpoint.Checkpoints(root, rank, kept=3) for rank in range(2)]
    assert [files.latest() for files in resumed] == [2, 2]  # the one written when it stopped
    for files in resumed:
        before, after = files.load(1), files.load(2)
        assert_same(after["trainer"], before["trainer"])
        assert after["learner"]["applied"] == before["learner"]["applied"]
        assert after["learner"]["versions"] >= before["learner"]["versions"]
    ranks = [files.load(2)["trainer"] for files in resumed]
    assert torch.equal(ranks[0]["core"]["flat"], ranks[1]["core"]["flat"])
    assert torch.equal(ranks[0]["optimizer"]["exp_avg"], ranks[1]["optimizer"]["exp_avg"])
    assert float(ranks[0]["optimizer"]["steps"][0]) > 0  # it had trained: the moments are not the fresh zeros


def test_ranks_started_with_restart_come_back_into_a_new_world_on_their_own(
    start_service: Any, tmp_path: Path, redis_url: str, run_id: str
) -> None:
    """Ranks started one by one with `--restart`, as on several machines: rank 1's learner process
    is killed (its host lost); rank 0 loses its world and exits for a restart; each restart loop
    starts its rank again, and the new world resumes from the newest checkpoint and trains on. A
    stop ends each loop and its rank, leaving no process behind."""
    root = tmp_path / "checkpoints"
    coord = start_coordinator(start_service, tmp_path, redis_url, run_id, num_learners=2, checkpoint_interval_s=1.0)
    world = start_world(start_service, coord, run_id, root, "restarting", "", "--restart")
    actor = start_service(
        "actor",
        "actor",
        "--name",
        "actor-0",
        "--coordinator",
        f"tcp://127.0.0.1:{coord['control']}",
        "--broadcast",
        f"tcp://127.0.0.1:{coord['broadcast']}",
        "--metrics-port",
        "-1",
    )
    files = [checkpoint.Checkpoints(root, rank, kept=3) for rank in range(2)]
    wait_for(lambda: all((f.latest() or 0) >= 1 for f in files), 120, "a checkpoint of each rank")
    store = RunStore.connect(redis_url, run_id)
    (rank_1,) = [pid for pid, command in descendants(world[1].process.pid).items() if "learner" in command]
    os.kill(rank_1, signal.SIGKILL)
    killed_at = store.weights(0).version
    for rank, (service, why) in enumerate(zip(world, ("world was lost", "rank was killed (signal 9)"), strict=True)):
        wait_for(
            lambda s=service, w=why: w in s.log() and "resumed from checkpoint" in s.log(),
            120,
            f"rank {rank} to come back",
        )
    wait_for(lambda: store.weights(0).version > killed_at + 5, 120, "the new world to train past the old one")
    assert world[0].alive() and world[1].alive() and actor.alive()
    ranks = [pid for service in world for pid in descendants(service.process.pid)]
    for service in world:
        service.process.terminate()
    for service in world:
        assert service.process.wait(60) == 0, service.log()
    assert not [pid for pid in ranks if Path(f"/proc/{pid}").exists()]  # the loops' children went with them
