"""What the end-to-end tests (and bench_churn.py) share: starting `rlmq up`, waiting on it, stopping
it with Ctrl-C and reading what it left, and finding its processes in /proc. Imported as `procs`
(tests/conftest.py puts this folder on the path)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from rlmq.cli.redis_server import RedisServer
from rlmq.cli.rundir import run_redis_of
from rlmq.common.transport import free_port
from rlmq.coordinator.records import LoggedDecision, LoggedGeneration, RunStatus
from rlmq.coordinator.store import RunStore
from rlmq.learners import checkpoint


def start_up(run_dir: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "rlmq.cli", "up", "--run-dir", str(run_dir), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, up: subprocess.Popen[str] | None = None) -> Any:
    """`predicate()`'s first true value within `timeout` s; with `up`, the run must not end first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if up is not None and up.poll() is not None:
            raise AssertionError(f"rlmq up ended while waiting for {what}:\n{up.communicate()[0]}")
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def wait_until_stepping(run_dir: Path, up: subprocess.Popen[str], timeout: float = 90) -> RunStore:
    """The run's store, once its actors have taken an env step."""

    def stepping() -> RunStore | None:
        if not (run_dir / "run.json").exists():
            return None
        store = RunStore.connect(*run_redis_of(run_dir))
        try:
            return store if store.status().env_steps > 0 else None
        except redis.ConnectionError:  # the run is over and its Redis gone: the next poll says why
            return None

    return wait_for(stepping, timeout, "the run's first env step", up)


def in_redis(run_dir: Path) -> tuple[RunStatus, list[LoggedDecision], list[LoggedGeneration]]:
    """The run's status, PBT log and CEM-RL generations as its private Redis kept them (its
    append-only file)."""
    with RedisServer(run_dir / "redis") as server:
        store = RunStore.connect(server.url, json.loads((run_dir / "run.json").read_text())["run"])
        return store.status(), store.decisions(), store.generations()


def stop_with_ctrl_c(up: subprocess.Popen[str], run_dir: Path) -> tuple[int, dict[str, Any]]:
    """Ctrl-C `rlmq up`, which exits 130; the number and state of the checkpoint it wrote on stopping."""
    up.send_signal(signal.SIGINT)
    out, _ = up.communicate(timeout=60)
    assert up.returncode == 130, out
    files = checkpoint.Checkpoints(run_dir / "checkpoints", 0, kept=3)
    return files.latest(), files.load(files.latest())


def descendants(pid: int) -> dict[int, str]:
    """pid → command line of every process below `pid` (parent links from /proc/PID/stat)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found: dict[int, str] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in found:
                try:
                    found[child] = (Path("/proc") / str(child) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    found[child] = ""
                frontier.append(child)
    return found


def running(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def write_run_config(tmp_path: Path, **fields: Any) -> Path:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"num_learners": 1, "num_envs": 4, "rollout_length": 8, **fields}))
    return path


def start_coordinator(
    start_service: Any,
    tmp_path: Path,
    redis_url: str,
    run_id: str,
    env: dict[str, str] | None = None,
    ports: dict[str, int] | None = None,
    name: str = "coordinator",
    args: tuple[str, ...] = (),
    **config: Any,
) -> dict[str, Any]:
    ports = ports or {"control": free_port(), "broadcast": free_port(), "metrics": free_port()}
    service = start_service(
        name,
        "coordinator",
        "--run",
        run_id,
        "--redis-url",
        redis_url,
        "--run-config",
        str(write_run_config(tmp_path, **config)),
        "--metrics-port",
        str(ports["metrics"]),
        "--control-bind",
        f"tcp://127.0.0.1:{ports['control']}",
        "--broadcast-bind",
        f"tcp://127.0.0.1:{ports['broadcast']}",
        *args,
        env=env,
    )
    return {"service": service, **ports}
