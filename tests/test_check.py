"""`rlmq check`, the container probe, run as the kubelet runs it (a process; exit code and one
line): it passes against a real coordinator and a real actor once their loops run (the probes in
deploy/k8s rely on it), and fails with a line naming the fix on a closed port, a missing, unset or
stale loop heartbeat, and an unreachable Redis."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from rlmq.common import wire
from rlmq.common.config import RunConfig
from rlmq.common.metrics import Heartbeat
from rlmq.common.schema import EnvSpec
from rlmq.common.transport import free_port
from rlmq.learners.networks import ActorCritic
from tests.helpers.references import to_numpy_params

CARTPOLE = EnvSpec(obs_shape=(4,), action_kind="discrete", action_dim=2)


def probe(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlmq.cli", "check", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
        check=False,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ")
    return line


def test_passes_against_a_running_coordinator(start_service: Any, redis_url: str, run_id: str) -> None:
    metrics = free_port()
    coordinator = start_service(
        "coordinator",
        "coordinator",
        "--run",
        run_id,
        "--redis-url",
        redis_url,
        "--metrics-port",
        str(metrics),
        "--control-bind",
        f"tcp://127.0.0.1:{free_port()}",
        "--broadcast-bind",
        f"tcp://127.0.0.1:{free_port()}",
    )
    deadline = time.monotonic() + 60
    while (
        result := probe("--max-age", "10", "--redis-url", redis_url, env={"RLMQ_METRICS_PORT": str(metrics)})
    ).returncode != 0:
        assert coordinator.alive(), coordinator.log()
        assert time.monotonic() < deadline, result.stderr
        time.sleep(0.2)
    assert result.stdout.startswith(f"ok: /metrics on :{metrics} answers; loop ran ")
    assert result.stdout.rstrip().endswith("Redis answers")
    closed = f"redis://127.0.0.1:{free_port()}/0"  # readiness of a coordinator whose Redis is gone
    line = one_error_line(probe("--metrics-port", str(metrics), "--redis-url", closed, "--timeout", "0.5"))
    assert f"Redis at {closed} does not answer PING" in line


def wait_until_healthy(port: int, service: Any, *args: str) -> subprocess.CompletedProcess[str]:
    deadline = time.monotonic() + 30
    while (result := probe("--metrics-port", str(port), *args)).returncode != 0:
        assert service.alive(), service.log()
        assert time.monotonic() < deadline, result.stderr
        time.sleep(0.2)
    return result


def test_passes_against_a_running_actor(start_service: Any) -> None:
    """An actor is not live until assigned (its startup probe waits); then its loop beats."""
    ctx = zmq.Context.instance()
    control, learner = ctx.socket(zmq.ROUTER), ctx.socket(zmq.ROUTER)  # a stand-in coordinator, learner
    control_port, learner_port = (s.bind_to_random_port("tcp://127.0.0.1") for s in (control, learner))
    metrics = free_port()
    try:
        actor = start_service(
            "actor",
            "actor",
            "--name",
            "actor-0",
            "--coordinator",
            f"tcp://127.0.0.1:{control_port}",
            "--broadcast",
            f"tcp://127.0.0.1:{free_port()}",
            "--metrics-port",
            str(metrics),
        )
        assert control.poll(30_000), actor.log()
        identity, _hello = control.recv_multipart()
        assert "has not started yet" in one_error_line(probe("--metrics-port", str(metrics), "--max-age", "30"))
        weights = wire.Weights(member=0, version=1, params=to_numpy_params(ActorCritic(CARTPOLE, (8,))))
        assign = wire.Assign(
            run="t",
            member=0,
            actor_index=0,
            config=RunConfig(num_envs=2, rollout_length=8),
            env_spec=CARTPOLE,
            learner_endpoints=(f"tcp://127.0.0.1:{learner_port}",),
            weights=weights,
        )
        control.send_multipart([identity, wire.encode(assign)])
        assert learner.poll(30_000), actor.log()
        who, _frame = learner.recv_multipart()
        learner.send_multipart([who, wire.encode(wire.Credit(1))])
        wait_until_healthy(metrics, actor, "--max-age", "10")
    finally:
        control.close(linger=0)
        learner.close(linger=0)


def test_fails_clearly_on_a_closed_port() -> None:
    port = free_port()  # nothing listens there
    line = one_error_line(probe("--metrics-port", str(port), "--timeout", "0.5"))
    assert f"nothing answers on http://127.0.0.1:{port}/metrics" in line and "--metrics-port" in line
    usage = probe("--metrics-port", "0")
    assert usage.returncode == 2 and "RLMQ_METRICS_PORT" in usage.stderr


@pytest.fixture
def fake_service() -> Iterator[tuple[int, CollectorRegistry]]:
    """A /metrics endpoint whose registry the test fills as it likes."""
    registry = CollectorRegistry()
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    yield int(server.server_port), registry
    server.shutdown()
    thread.join(5)


def test_fails_on_a_missing_unset_or_stale_heartbeat(fake_service: tuple[int, CollectorRegistry]) -> None:
    port, registry = fake_service
    Gauge("rlmq_actor_policy_version", "Something else.", registry=registry).set(3)
    assert probe("--metrics-port", str(port)).returncode == 0  # readiness without --max-age
    line = one_error_line(probe("--metrics-port", str(port), "--max-age", "30"))
    assert "has no rlmq_loop_heartbeat_timestamp_seconds" in line

    heartbeat = Heartbeat(registry)  # the gauge the services export: 0 until their loop runs
    assert "has not started yet" in one_error_line(probe("--metrics-port", str(port), "--max-age", "30"))
    heartbeat.gauge.set(time.time() - 100)
    line = one_error_line(probe("--metrics-port", str(port), "--max-age", "30"))
    assert re.search(r"last ran 10\d s ago \(> --max-age 30\)", line) and "restart" in line
    heartbeat.beat()
    beaten = time.time()
    fresh = probe("--metrics-port", str(port), "--max-age", "30")
    ran = re.fullmatch(rf"ok: /metrics on :{port} answers; loop ran (\d+\.\d) s ago\n", fresh.stdout)
    assert fresh.returncode == 0 and ran is not None, fresh
    # The beat's age, however long the probe took to start (over a second on a loaded machine).
    assert float(ran[1]) <= time.time() - beaten + 0.1, (ran[1], time.time() - beaten)
