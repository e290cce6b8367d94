"""The README's "Several machines without Kubernetes" run, started on simulated hosts
(hosts.py) exactly as the README gives it, and watched from the test's own namespace: what
tests/test_hosts.py and benchmarks/bench_hosts.py share. Imported as `several_machines`."""

from __future__ import annotations

import collections
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import hosts

HOSTS = ["hub", "learner-0", "learner-1", "actors-0", "actors-1"]
ACTORS = [f"actor-{i}" for i in range(4)]  # two on each actor host
RLMQ = [sys.executable, "-m", "rlmq.cli"]


def readme_section(repo_root: Path) -> tuple[str, dict[str, str]]:
    """The run config and the commands (by subcommand) of the README's several-machines section."""
    text = (repo_root / "README.md").read_text()
    section = text.split("## Several machines without Kubernetes", 1)[1].split("\n## ", 1)[0]
    toml = re.search(r"```toml\n(.*?)```", section, re.S)
    bash = re.search(r"```bash\n(.*?)```", section, re.S)
    assert toml and bash, "the README's several-machines section lost its run config or its commands"
    commands = [line for line in bash.group(1).splitlines() if line.startswith("rlmq ")]
    return toml.group(1), {command.split()[1]: command for command in commands}


def flag(command: str, name: str) -> str:
    found = re.search(rf"--{name} (\S+)", command)
    assert found, f"no --{name} in {command!r}"
    return found.group(1)


class Watch:
    """The run as Redis on the hub has it, read by watch_run.py there: the latest line, kept fresh."""

    def __init__(self, net: hosts.Hosts, url: str, password_file: str, run: str, received: bool = False) -> None:
        """`received`: each line also has the env steps each learner rank received ("received")."""
        helper = Path(__file__).parent / "watch_run.py"
        watched = [url, password_file, run, *(["--received"] if received else []), *ACTORS]
        self.process = net.start(
            "hub",
            [sys.executable, str(helper), *watched],
            "watch.err",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,
            text=True,
        )
        self.latest: dict[str, Any] = {}
        self.lines: collections.deque[dict[str, Any]] = collections.deque(maxlen=100_000)  # oldest first
        self.actors: dict[str, subprocess.Popen[Any]] = {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.latest = json.loads(line)
            self.lines.append(self.latest)

    def until(self, predicate: Any, timeout: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.latest and predicate(self.latest):
                return self.latest
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; last seen {self.latest}")

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()


def delivered(seen: dict[str, Any], actor: str) -> int:
    return int(seen["tallies"][actor].get("delivered_steps", 0))


def status(net: hosts.Hosts, repo_root: Path) -> subprocess.CompletedProcess[str]:
    """The README's `rlmq status`, run on the hub."""
    command = readme_section(repo_root)[1]["status"]
    return subprocess.run(
        net.command("hub", RLMQ + command.split()[1:]), cwd=net.workdir, capture_output=True, text=True, timeout=60
    )


def start(net: hosts.Hosts, repo_root: Path, received: bool = False, ppo_sync: str = "") -> Watch:
    """Write the README's run config into the hosts' workdir and run its commands there: the keys,
    Redis and the coordinator on "hub", a learner rank on each learner host, two actors on each
    actor host; returns the watch on the run (its `actors`: each actor's process). `ppo_sync`: a
    `ppo.sync` in the config's place (benchmarks/bench_hosts.py compares them)."""
    config, by_kind = readme_section(repo_root)
    if ppo_sync:
        assert "[ppo]\n" in config, "the README's run config has no [ppo] table"
        config = config.replace("[ppo]\n", f'[ppo]\nsync = "{ppo_sync}"\n')
    workdir = net.workdir
    (workdir / "run.toml").write_text(config)

    def argv(command: str, **values: object) -> list[str]:
        for placeholder, value in {"HUB": net.address("hub"), **values}.items():
            command = re.sub(rf"\b{placeholder}\b", str(value), command)
        return RLMQ + command.split()[1:]

    subprocess.run(argv(by_kind["keys"]), cwd=workdir, check=True, capture_output=True)
    net.start("hub", argv(by_kind["redis"]), "redis.log")
    password = flag(by_kind["coordinator"], "redis-password-file")
    deadline = time.monotonic() + 30
    while not (workdir / password).exists() and time.monotonic() < deadline:  # made at Redis's first start
        time.sleep(0.05)
    net.start("hub", argv(by_kind["coordinator"]), "coordinator.log")
    for rank in (0, 1):
        net.start(f"learner-{rank}", argv(by_kind["learner"], R=rank), f"learner-{rank}.log")
    actors = {
        actor: net.start(f"actors-{i // 2}", argv(by_kind["actor"], I=i), f"{actor}.log")
        for i, actor in enumerate(ACTORS)
    }
    coordinator = by_kind["coordinator"]
    watch = Watch(net, flag(coordinator, "redis-url"), str(workdir / password), flag(coordinator, "run"), received)
    watch.actors = actors
    return watch
