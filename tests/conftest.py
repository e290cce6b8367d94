"""Shared fixtures: a private Redis server per test session (real, on a free port)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from rlmq.cli.redis_server import RedisServer

# tests/helpers/procs.py, shared by the end-to-end tests, imports as `procs` (the tests themselves are
# imported by path, --import-mode=importlib, so they cannot import one another).
sys.path.insert(0, str(Path(__file__).parent / "helpers"))


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("redis"), persist=False) as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def redis_client(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


@pytest.fixture
def run_id() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


class Service:
    """One rlmq service started as its own OS process (`python -m rlmq.cli ...`)."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        import os
        import subprocess
        import sys

        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "rlmq.cli", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
            )

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> int:
        import subprocess

        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def start_service(tmp_path: Path) -> Iterator[object]:
    services: list[Service] = []

    def start(name: str, *args: str, env: dict[str, str] | None = None) -> Service:
        service = Service(list(args), tmp_path / f"{name}.log", env)
        services.append(service)
        return service

    yield start
    for service in services:
        service.stop()
