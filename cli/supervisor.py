"""`rlmq up`: start a private Redis, the coordinator, the learner world and the actors as separate
OS processes; watch them; restart actors that die; show progress; stop everything cleanly.

Children run in their own sessions, so a terminal's Ctrl-C reaches only this supervisor, which
forwards it: the first stops them warmly (SIGTERM, bounded wait, then SIGKILL), the second kills
them at once. Each child also gets SIGKILL if the supervisor itself dies (PR_SET_PDEATHSIG), so no
process outlives the run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlmq.cli import rundir
from rlmq.cli.redis_server import RedisServer
from rlmq.common import envs
from rlmq.common.config import RunConfig, from_mapping, load_run_config, to_json
from rlmq.common.service import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TARGET_MISSED,
    EXIT_USAGE,
    RateTimer,
    StopFlag,
    die_with_parent,
)  # fmt: skip
from rlmq.common.transport import free_port
from rlmq.coordinator.store import RunStore

WARM_STOP_S = 15.0  # after SIGTERM, how long children get before SIGKILL
MAX_ACTOR_RESTARTS = 50
PROGRESS_EVERY_S = 2.0


@dataclass(frozen=True)
class UpConfig:
    actors: int
    learners: int
    run_config: RunConfig
    run: str
    run_dir: Path
    redis_url: str | None = None
    torch_threads: int = 1
    device: str = "auto"  # the learners' (distributed.choose_device)

    @classmethod
    def build(cls, *, actors: int, learners: int, config_file: Path | None, overrides: dict[str, Any],
              redis_url: str | None, run_dir: Path | None, torch_threads: int, device: str = "auto") -> UpConfig:
        run_config = load_run_config(config_file, overrides) if config_file else from_mapping(RunConfig, overrides)
        if actors < run_config.population:  # a member without an actor would never train
            raise ValueError(f"{actors} actor(s) for a population of {run_config.population}: "
                             f"use --actors {run_config.population} or more")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
            raise ValueError(f"--device {device}: use auto, cpu, cuda or cuda:N")
        run = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        return cls(actors=actors, learners=learners, run_config=run_config, run=run,
                   run_dir=run_dir or Path("runs") / run, redis_url=redis_url, torch_threads=torch_threads,
                   device=device)


@dataclass
class Child:
    name: str
    role: str
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    log_path: Path = field(default_factory=Path)
    metrics_port: int = 0


class Supervisor:
    def __init__(self, cfg: UpConfig, redis_url: str, redis_server: RedisServer | None) -> None:
        self.cfg, self.redis_url, self.redis_server = cfg, redis_url, redis_server
        self.children: list[Child] = []
        self.stop = StopFlag()
        self.log_dir = cfg.run_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        one = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **one}
        threads = str(cfg.torch_threads)  # learners alone may get more (torch's pool, NumPy's OpenBLAS)
        self.learner_env = {**self.env, **dict.fromkeys(one, threads)}

    def plan(self) -> None:
        control, broadcast, master = free_port(), free_port(), free_port()
        base = [sys.executable, "-m", "rlmq.cli"]
        endpoints = ["--coordinator", f"tcp://127.0.0.1:{control}", "--broadcast", f"tcp://127.0.0.1:{broadcast}"]
        self.children.append(Child("coordinator", "coordinator", [
            *base, "coordinator", "--run", self.cfg.run, "--redis-url", self.redis_url,
            "--run-config", str(self.cfg.run_dir / "config.json"),
            "--control-bind", f"tcp://127.0.0.1:{control}", "--broadcast-bind", f"tcp://127.0.0.1:{broadcast}"]))
        for rank in range(self.cfg.learners):
            self.children.append(Child(f"learner-{rank}", "learner", [
                *base, "learner", "--run", self.cfg.run, *endpoints, "--rank", str(rank),
                "--world-size", str(self.cfg.learners), "--master-port", str(master),
                "--torch-threads", str(self.cfg.torch_threads), "--device", self.cfg.device]))
        for index in range(self.cfg.actors):
            self.children.append(Child(f"actor-{index}", "actor", [*base, "actor", "--name", f"actor-{index}", *endpoints]))
        for child in self.children:  # known ports, so that Prometheus can be told where to scrape
            child.metrics_port = free_port()
            child.argv += ["--metrics-port", str(child.metrics_port)]
        write_scrape_targets(self.cfg.run_dir / "prometheus_targets.json", self.cfg.run, self.children)

    def spawn(self, child: Child) -> None:
        child.log_path = self.log_dir / f"{child.name}.log"
        with open(child.log_path, "ab") as log_file:
            child.process = subprocess.Popen(
                child.argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                env=self.learner_env if child.role == "learner" else self.env,
                start_new_session=True, preexec_fn=die_with_parent,
            )

    def kill_all(self, sig: int) -> None:
        for child in self.children:
            if child.process is not None and child.process.poll() is None:
                try:
                    os.killpg(child.process.pid, sig)
                except ProcessLookupError:
                    pass

    def install_signals(self) -> None:
        def handle(signum: int, frame: object) -> None:
            if self.stop.is_set():
                print("\nsecond interrupt: killing every process now", file=sys.stderr, flush=True)
                self.kill_all(signal.SIGKILL)
                if self.redis_server is not None:
                    self.redis_server.process.kill()
                os._exit(EXIT_INTERRUPTED)
            print("\ninterrupt: stopping warmly (again to stop at once)", file=sys.stderr, flush=True)
            self.stop.set(signal.Signals(signum).name)

        signal.signal(signal.SIGINT, handle)
        signal.signal(signal.SIGTERM, handle)

    def watch(self, store: RunStore) -> str:
        """Until the run ends: 'over' (coordinator finished), 'interrupted' or 'failed: why'."""
        started = time.monotonic()
        progress = RateTimer(PROGRESS_EVERY_S)
        while not self.stop.wait(0.2):
            for child in self.children:
                assert child.process is not None
                code = child.process.poll()
                if code is None:
                    continue
                if child.role == "coordinator":
                    return "over" if code == 0 else f"failed: the coordinator exited with {code}; see {child.log_path}"
                if store.status().get("state") in ("stopping", "done"):
                    continue  # the run is ending: exits are expected
                if child.role == "learner":
                    return f"failed: {child.name} exited with {code}; see {child.log_path}"
                if child.restarts >= MAX_ACTOR_RESTARTS:
                    return f"failed: {child.name} died {child.restarts} times; see {child.log_path}"
                child.restarts += 1
                print(f"{child.name} exited with {code}; restarting it ({child.restarts})", flush=True)
                self.spawn(child)
            if progress.due():
                print(format_progress(store.status(), time.monotonic() - started, self.cfg.actors), flush=True)
        return "interrupted"

    def shut_down(self) -> None:
        """Warm: SIGTERM, a bounded wait, then SIGKILL for whatever is left."""
        self.kill_all(signal.SIGTERM)
        deadline = time.monotonic() + WARM_STOP_S
        for child in self.children:
            assert child.process is not None
            try:
                child.process.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                pass
        self.kill_all(signal.SIGKILL)
        for child in self.children:
            assert child.process is not None
            child.process.wait()


def write_scrape_targets(path: Path, run: str, children: list[Child]) -> None:
    """Prometheus file_sd targets, one group per role: point a `file_sd_configs` job at this file
    (Prometheus re-reads it when it changes) to scrape every process of the run."""
    groups = []
    for role in ("coordinator", "learner", "actor"):
        targets = [f"127.0.0.1:{c.metrics_port}" for c in children if c.role == role]
        if targets:
            groups.append({"targets": targets, "labels": {"job": "rlmq", "role": role, "run": run}})
    with rundir.atomic(path) as tmp:
        tmp.write_text(json.dumps(groups, indent=2))


def format_progress(status: dict[str, Any], elapsed: float, actors: int) -> str:
    mean = status.get("mean_return")
    return (f"{elapsed:7.1f}s  env steps {int(status.get('env_steps', 0)):>10,}  "
            f"{float(status.get('steps_per_s', 0.0)):>8,.0f}/s  episodes {int(status.get('episodes', 0)):>7,}  "
            f"mean return {'—' if mean is None else f'{mean:7.1f}'}  "
            f"lag {float(status.get('policy_lag', 0.0)):4.1f}  actors {status.get('actors', 0)}/{actors}")


def run_up(cfg: UpConfig) -> int:
    try:
        spec = envs.probe(cfg.run_config.env_id, cfg.run_config.algo)
    except envs.EnvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    (cfg.run_dir / "config.json").write_text(to_json(cfg.run_config))
    rundir.point_latest(cfg.run_dir)
    redis_server = None if cfg.redis_url else RedisServer(cfg.run_dir / "redis")
    redis_url = cfg.redis_url or redis_server.url  # type: ignore[union-attr]
    with rundir.atomic(cfg.run_dir / "run.json") as tmp:  # `rlmq status` may read it at any moment
        tmp.write_text(json.dumps({"run": cfg.run, "redis_url": redis_url, "pid": os.getpid()}))
    supervisor = Supervisor(cfg, redis_url, redis_server)
    supervisor.install_signals()
    store = RunStore.connect(redis_url, cfg.run)
    launched = time.time()
    try:
        print(f"rlmq up: run {cfg.run} in {cfg.run_dir}: {cfg.actors} actor(s) × {cfg.run_config.num_envs} "
              f"{cfg.run_config.env_id}, {cfg.learners} learner(s), {cfg.run_config.algo}", flush=True)
        supervisor.plan()
        for child in supervisor.children:
            supervisor.spawn(child)
        outcome = supervisor.watch(store)
        supervisor.shut_down()
        status = store.status()
        rundir.write_results(cfg.run_dir, store, spec, cfg.run_config, launched, outcome)
    finally:
        supervisor.kill_all(signal.SIGKILL)
        if redis_server is not None:
            redis_server.stop()
    return verdict(outcome, status, cfg.run_config)


def verdict(outcome: str, status: dict[str, Any], run_config: RunConfig) -> int:
    if outcome == "interrupted":
        print("interrupted; results so far are in the run directory", file=sys.stderr)
        return EXIT_INTERRUPTED
    if outcome.startswith("failed"):
        print(f"error: run {outcome}", file=sys.stderr)
        return EXIT_FAILED
    detail = status.get("detail", "")
    if status.get("success"):
        print(f"done: {detail}")
        return EXIT_OK
    print(f"target not reached: {detail} (target return {run_config.target_return}); raise "
          "--total-steps or tune the config", file=sys.stderr)
    return EXIT_TARGET_MISSED

