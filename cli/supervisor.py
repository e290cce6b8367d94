"""`rlmq up`: start a private Redis, the coordinator, the learner world and the actors as separate
OS processes; watch them; restart actors and the coordinator when they die, and the whole learner
world when one of its ranks does; show progress; stop everything cleanly.

Children run in their own sessions, so a terminal's Ctrl-C reaches only this supervisor, which
forwards it: the first stops them warmly (SIGTERM, bounded wait, then SIGKILL), the second kills
them at once. Each child also gets SIGKILL if the supervisor itself dies (PR_SET_PDEATHSIG), so no
process outlives the run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rlmq.cli import children, run_redis, rundir
from rlmq.cli.children import Child, Listener
from rlmq.cli.redis_server import RedisServer
from rlmq.cli.upconfig import UpConfig
from rlmq.common.service import EXIT_DISK, EXIT_INTERRUPTED, RateTimer, StopFlag, die_with_parent
from rlmq.coordinator.records import RunStatus
from rlmq.coordinator.store import OUTAGE_ERRORS, RunStore

WARM_STOP_S = 15.0  # after SIGTERM, how long children get before SIGKILL
MAX_ACTOR_RESTARTS = 50
MAX_WORLD_RESTARTS = 10  # learner worlds started again after a rank exited
MAX_COORDINATOR_RESTARTS = 10
PROGRESS_EVERY_S = 2.0
HUNG_CHECK_S = 0.5  # how often the status is read for learner ranks the coordinator names hung


class Supervisor:
    def __init__(
        self, cfg: UpConfig, redis_url: str, redis_server: RedisServer | None, redis_outage_s: float = 30.0
    ) -> None:
        self.cfg, self.redis_url, self.redis_server = cfg, redis_url, redis_server
        # The coordinator is told the URL without its password, and where to read the password.
        self.redis_address, self.redis_password_file = run_redis.redis_address(redis_url, redis_server, cfg.run_dir)
        self.redis = run_redis.RunRedis(redis_url, redis_server, redis_outage_s, cfg.run, cfg.run_dir, cfg.run_config)
        self.children: list[Child] = []
        self.world_restarts = 0
        self.hung_restarted = False  # the world was restarted for the ranks the coordinator names hung
        self.reach = "127.0.0.1"  # where children reach each other and Prometheus reaches them (plan)
        self.sockets = children.Sockets()
        self.stop = StopFlag()
        self.log_dir = cfg.run_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        one = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **one}
        threads = str(cfg.torch_threads)  # learners alone may get more (torch's pool, NumPy's OpenBLAS)
        self.learner_env = {**self.env, **dict.fromkeys(one, threads)}

    def plan(self) -> None:
        self.children, self.reach = children.plan(self.cfg, self.redis_address, self.redis_password_file, self.sockets)
        self.write_scrape_targets()

    def write_scrape_targets(self) -> None:
        write_scrape_targets(self.cfg.run_dir / "prometheus_targets.json", self.cfg.run, self.children, self.reach)

    def announce_path(self, child: Child) -> Path:
        return children.announce_path(self.cfg.run_dir, child)

    def refresh_scrape_targets(self) -> None:
        """Follow the metrics ports the children announce they bound (a restarted child may have
        had to take another): rewrite the scrape targets when one changed."""
        changed = False
        for child in self.children:
            try:
                bound = int(json.loads(self.announce_path(child).read_text())["metrics_port"])
            except (OSError, ValueError, KeyError, TypeError):  # not started yet, or mid-write
                continue
            if bound != child.metrics_port:
                child.metrics_port, changed = bound, True
        if changed:
            self.write_scrape_targets()

    def start(self) -> None:
        """Every child: the coordinator, the learner world, the actors."""
        for child in self.children:
            if child.role == "coordinator":
                self.spawn(child)
        self.start_learner_world()
        for child in self.children:
            if child.role == "actor":
                self.spawn(child)

    def start_learner_world(self) -> None:
        """Every learner rank, with a rendezvous of their own that rank 0 serves on a socket bound
        here (a world started again gets a new one: the old one's state went with its rank 0)."""
        master = self.sockets.tcp(self.cfg.bind_host)
        for child in self.children:
            if child.role == "learner":
                first = child.rank == 0
                self.spawn(
                    child,
                    ["--master-port", str(master.port), *(["--master-fd", str(master.fd)] if first else [])],
                    [master] if first else [],
                )
        master.sock.close()

    def spawn(self, child: Child, argv: Sequence[str] = (), listeners: Sequence[Listener] = ()) -> None:
        """Start `child`, with `argv` and `listeners` of this start's own beside its planned ones."""
        child.log_path = self.log_dir / f"{child.name}.log"
        with open(child.log_path, "ab") as log_file:
            child.process = subprocess.Popen(
                [*child.argv, *argv],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=self.learner_env if child.role == "learner" else self.env,
                start_new_session=True,
                preexec_fn=die_with_parent,
                pass_fds=[listener.fd for listener in (*child.listeners, *listeners)],
            )

    def restart_learner_world(self, why: str, log_path: Path) -> str | None:
        """A rank exited or hangs, and the others cannot go on without it (every collective waits for
        every rank): stop them all at once and start the world again; it resumes from its newest
        checkpoint (learners/checkpoint.py). "failed: why" once it has restarted too often."""
        if self.world_restarts >= MAX_WORLD_RESTARTS:
            return (
                f"failed: {why}, and the learner world was restarted {self.world_restarts} times already; "
                f"see {log_path}"
            )
        self.world_restarts += 1
        print(
            f"{why}; restarting the learner world from its newest checkpoint ({self.world_restarts}); see {log_path}",
            flush=True,
        )
        ranks = [child for child in self.children if child.role == "learner"]
        for child in ranks:  # its state is the checkpoint's: nothing to save on the way down
            self.kill(child, signal.SIGKILL)
        for child in ranks:
            assert child.process is not None
            child.process.wait()
            child.restarts += 1
        self.start_learner_world()
        return None

    def kill(self, child: Child, sig: int) -> None:
        if child.process is not None and child.process.poll() is None:
            try:
                os.killpg(child.process.pid, sig)
            except ProcessLookupError:
                pass

    def kill_all(self, sig: int) -> None:
        for child in self.children:
            self.kill(child, sig)

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
        """Until the run ends: 'over' (coordinator finished), 'interrupted' or 'failed: why'.

        `store` should give up fast (run_redis.WATCH_REDIS_S): while Redis is down, the last status read
        stands in for the current one."""
        started = time.monotonic()
        progress = RateTimer(PROGRESS_EVERY_S)
        hung_check = RateTimer(HUNG_CHECK_S)
        while not self.stop.wait(0.2):
            failed = self.redis.keep_up()
            if failed:
                return failed
            for child in self.children:
                assert child.process is not None
                code = child.process.poll()
                if code is None:
                    continue
                if code == EXIT_DISK:  # a restart would meet the same disk
                    return f"failed: {self.disk_refused(child)}"
                if child.role == "coordinator":
                    if code == 0:
                        return "over"
                    # Killed by a signal (the OOM killer, a user): it resumes from Redis, and the others
                    # wait for it meanwhile (actors keep their reports). An exit of its own says why
                    # in its log (Redis gone past --redis-outage-s, a bad config): the run is over.
                    if code > 0 or child.restarts >= MAX_COORDINATOR_RESTARTS:
                        return f"failed: the coordinator exited with {code}; see {child.log_path}"
                    child.restarts += 1
                    print(
                        f"the coordinator exited with {code}; restarting it ({child.restarts}); see {child.log_path}",
                        flush=True,
                    )
                    self.spawn(child)
                    continue
                self.redis.look(store)
                if self.redis.seen.status.state in ("stopping", "done"):
                    continue  # the run is ending: exits are expected
                if child.role == "learner":
                    # The rank that exits is often the one that waited for a hung or dead peer:
                    # the message names the one the coordinator saw holding the world up.
                    behind = self.redis.seen.status.learners_behind
                    failed = self.restart_learner_world(
                        f"{child.name} exited with {code}"
                        + (f" (before that, the coordinator saw {behind})" if behind else ""),
                        child.log_path,
                    )
                    if failed:
                        return failed
                    continue
                if child.restarts >= MAX_ACTOR_RESTARTS:
                    return f"failed: {child.name} died {child.restarts} times; see {child.log_path}"
                child.restarts += 1
                print(f"{child.name} exited with {code}; restarting it ({child.restarts})", flush=True)
                self.spawn(child)
            if hung_check.due():
                failed = self.act_on_hung(store)
                if failed:
                    return failed
            if not progress.due():
                continue
            self.refresh_scrape_targets()
            if self.redis.look(store):
                print(format_progress(self.redis.seen.status, time.monotonic() - started, self.cfg.actors), flush=True)
        return "interrupted"

    def disk_refused(self, child: Child) -> str:
        """What a child that exited with EXIT_DISK said, and what to do."""
        said = last_line_with(child.log_path, "cannot write") or f"{child.name} exited with {EXIT_DISK}"
        return (
            f"{said}; free space on the disk of {self.cfg.run_dir} (or make it writable), then go on with "
            f"`rlmq up --resume {self.cfg.run_dir}`"
        )

    def final_checkpoint_refused(self) -> str | None:
        """After a run that ended ("over") and its children stopped: "failed: why" if a learner's
        disk refused its final checkpoint. The learner writes it after the final weights, so the
        coordinator may have finished before the learner said so."""
        for child in self.children:
            if child.role == "learner" and child.process is not None and child.process.returncode == EXIT_DISK:
                return f"failed: {self.disk_refused(child)}"
        return None

    def act_on_hung(self, store: RunStore) -> str | None:
        """The coordinator names ranks that are silent while a peer waits for them in a collective
        (stopped, or hung: `stragglers.hung`): restart the world now, not at the collective timeout.
        Once per naming: the old world's ranks stay named until the new world's are heard."""
        try:
            status = store.status()
        except OUTAGE_ERRORS:
            return None
        if not status.learners_hung or status.state != "running":
            self.hung_restarted = False
            return None
        if self.hung_restarted:
            return None
        self.hung_restarted = True
        names = ", ".join(f"learner-{rank}" for rank in status.learners_hung)
        return self.restart_learner_world(
            f"the coordinator saw {names} silent while the world waits for it (stopped or hung)",
            self.log_dir / f"learner-{status.learners_hung[0]}.log",
        )

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


def last_line_with(path: Path, needle: str) -> str:
    """The last line of a child's log that holds `needle`, without its time and name ("": none)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    found = next((line for line in reversed(lines) if needle in line), "")
    return found.split(" ERROR ", 1)[-1].strip()


def write_scrape_targets(path: Path, run: str, planned: list[Child], host: str = "127.0.0.1") -> None:
    """Prometheus file_sd targets, one group per role: point a `file_sd_configs` job at this file
    (Prometheus re-reads it when it changes) to scrape every process of the run."""
    groups = []
    for role in ("coordinator", "learner", "actor"):
        targets = [f"{host}:{c.metrics_port}" for c in planned if c.role == role]
        if targets:
            groups.append({"targets": targets, "labels": {"job": "rlmq", "role": role, "run": run}})
    with rundir.atomic(path) as tmp:
        tmp.write_text(json.dumps(groups, indent=2))


def format_progress(status: RunStatus, elapsed: float, actors: int) -> str:
    mean = status.mean_return
    return (
        f"{elapsed:7.1f}s  env steps {status.env_steps:>10,}  {status.steps_per_s:>8,.0f}/s  "
        f"episodes {status.episodes:>7,}  mean return {'—' if mean is None else f'{mean:7.1f}'}  "
        f"lag {status.policy_lag:4.1f}  actors {status.actors}/{actors}"
    )
