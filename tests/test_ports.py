"""Ports that cannot be lost: a process whose planned port is taken binds another, announces it,
and `rlmq up`'s scrape targets follow (real processes and sockets)."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from pathlib import Path
from typing import Any

import zmq

from rlmq.cli.supervisor import Supervisor
from rlmq.cli.upconfig import UpConfig


def test_a_process_whose_metrics_port_is_taken_comes_up_on_another_and_is_scraped(
    start_service: Any, tmp_path: Path
) -> None:
    squatter = socket.create_server(("127.0.0.1", 0))  # someone took the port planned for the actor
    taken = squatter.getsockname()[1]
    coordinator = zmq.Context.instance().socket(zmq.ROUTER)  # the actor serves /metrics before any Assign
    control = coordinator.bind_to_random_port("tcp://127.0.0.1")
    announced = tmp_path / "actor-0.json"
    try:
        actor = start_service(
            "actor",
            "actor",
            "--name",
            "actor-0",
            "--coordinator",
            f"tcp://127.0.0.1:{control}",
            "--broadcast",
            "tcp://127.0.0.1:1",
            "--metrics-port",
            str(taken),
            "--bind-host",
            "127.0.0.1",
            "--announce",
            str(announced),
        )
        deadline = time.monotonic() + 30
        while not announced.exists() and time.monotonic() < deadline:
            assert actor.alive(), actor.log()
            time.sleep(0.05)
        bound = json.loads(announced.read_text())["metrics_port"]
        assert bound != taken
        text = urllib.request.urlopen(f"http://127.0.0.1:{bound}/metrics", timeout=5).read().decode()
        assert "rlmq_actor_env_steps_total" in text
        assert actor.alive() and f"metrics port {taken} is taken" in actor.log()
    finally:
        squatter.close()
        coordinator.close(linger=0)


def test_the_scrape_targets_follow_the_ports_children_announce(tmp_path: Path) -> None:
    cfg = UpConfig.build(
        actors=2, learners=1, config=None, overrides={}, redis_url=None, run_dir=tmp_path, torch_threads=1
    )
    supervisor = Supervisor(cfg, "redis://127.0.0.1:1/0", None)
    supervisor.plan()
    planned = {c.name: c.metrics_port for c in supervisor.children}
    assert len(set(planned.values())) == len(planned), "two children were planned the same port"
    actor = next(c for c in supervisor.children if c.name == "actor-1")
    supervisor.announce_path(actor).write_text(json.dumps({"metrics_port": 40_001}))
    supervisor.refresh_scrape_targets()
    groups = json.loads((tmp_path / "prometheus_targets.json").read_text())
    targets = {t for g in groups if g["labels"]["role"] == "actor" for t in g["targets"]}
    assert targets == {f"127.0.0.1:{planned['actor-0']}", "127.0.0.1:40001"}
