"""Shared fixtures: a private Redis server per test session (real, on a free port)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from rlmq.cli.redis_server import RedisServer


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
