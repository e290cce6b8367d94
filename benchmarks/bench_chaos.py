"""Chaos: one `rlmq up` with faults on a schedule, and what each one cost.

    .venv/bin/python benchmarks/bench_chaos.py [--window 120] [--actor-every 10] [--learner-at 15]
        [--coordinator-at 30] [--redis-at 45] [--env Acrobot-v1] [--algo ppo] [--population 4]
        [--target -100] [--seed 0]

`rlmq up --actors 4 --learners 2` with a population under PBT (by default four PPO members on
Acrobot-v1 with its shipped config, to a mean return of −100: about two minutes on two cores, so
that the faults land while it learns and PBT decides), and, counted from the first update:
- an actor SIGKILLed every `--actor-every` seconds, for `--window` seconds;
- learner rank 1 SIGKILLed at `--learner-at` (the learner world restarts from its checkpoint);
- the coordinator SIGKILLed at `--coordinator-at` (rlmq up restarts it; it resumes from Redis);
- the run's private Redis server SIGKILLed at `--redis-at` (rlmq up restarts it on its AOF).
Then the run goes on to its end (the target, or `--max-wall`). Printed:
- the learners' longest stall: the longest time learner-0's update counter stood still (polled
  every 0.1 s, through the /metrics port it announces, which a restarted rank may change);
- each fault's recovery: until learner-0 updates again (learner), until the coordinator writes
  its status again (coordinator, Redis), until the killed actor's successor reports env steps;
- env steps lost: the actors' own counters (`rlmq_actor_env_steps_total`, counted when an actor
  reports; the last value polled from each actor process) against Redis's count at the end;
- PBT decisions: logged by the coordinator, applied by the learners' final state, and any id one
  learner world applied twice (a restarted world applies again, in order, the decisions after
  its checkpoint: that is the design, not a repeat);
- whether the target was reached, and when.

Results go to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "helpers"))
from procs import descendants  # noqa: E402  (the tests' helper, on the path above)

from rlmq.cli.rundir import run_redis_of  # noqa: E402
from rlmq.coordinator.store import RunStore  # noqa: E402

POLL_S = 0.1


def counter(port: int, name: str) -> float | None:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).read().decode()
    except OSError:
        return None
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def announced_port(run_dir: Path, child: str) -> int | None:
    try:
        return int(json.loads((run_dir / "ports" / f"{child}.json").read_text())["metrics_port"])
    except (OSError, ValueError, KeyError):
        return None


def children(up: subprocess.Popen[bytes]) -> dict[str, int]:
    """child name (coordinator, learner-R, actor-I, redis) → pid, for the processes alive now."""
    found: dict[str, int] = {}
    for pid, cmd in descendants(up.pid).items():
        if "-server" in cmd:
            found["redis"] = pid
        elif " coordinator " in cmd:
            found["coordinator"] = pid
        elif m := re.search(r" learner .*--rank (\d+) ", cmd):
            found[f"learner-{m.group(1)}"] = pid
        elif m := re.search(r" actor --name (actor-\d+) ", cmd):
            found[m.group(1)] = pid
    return found


class Watch:
    """What the poller saw: learner-0's updates, every actor process's env-step counter, faults."""

    def __init__(self, run_dir: Path, up: subprocess.Popen[bytes]) -> None:
        self.run_dir, self.up = run_dir, up
        self.updates_seen: float | None = None
        self.learner_pid = -1  # learner-0's process: its counter starts from 0 in a restarted world
        self.last_update_at: float | None = None
        self.first_update_at: float | None = None
        self.longest_stall = 0.0
        self.actor_steps: dict[int, float] = {}  # actor pid → its counter, last polled
        self.faults: list[dict[str, Any]] = []
        self.store = RunStore.connect(*run_redis_of(run_dir), outage_s=0, timeout_s=0.5, report=None)

    def poll(self) -> None:
        now = time.monotonic()
        live = children(self.up)
        port = announced_port(self.run_dir, "learner-0")
        updates = counter(port, "rlmq_learner_updates_total") if port else None
        if updates is not None and live.get("learner-0") != self.learner_pid:  # a new world: its own count
            self.learner_pid, self.updates_seen = live.get("learner-0", -1), updates
        elif updates is not None and updates != self.updates_seen:
            if self.last_update_at is not None:
                self.longest_stall = max(self.longest_stall, now - self.last_update_at)
            self.first_update_at = self.first_update_at or now
            self.last_update_at, self.updates_seen = now, updates
            for fault in self.faults:
                if fault["kind"] == "learner" and "recovered_s" not in fault and fault["world"] != self.learner_pid:
                    fault["recovered_s"] = now - fault["at"]
        for name, pid in live.items():
            if name.startswith("actor-") and (port := announced_port(self.run_dir, name)):
                steps = counter(port, "rlmq_actor_env_steps_total")
                if steps is not None and steps >= self.actor_steps.get(pid, 0):
                    self.actor_steps[pid] = steps
        for fault in self.faults:
            if "recovered_s" in fault:
                continue
            if fault["kind"] == "actor" and live.get(fault["name"], fault["pid"]) != fault["pid"]:
                if self.actor_steps.get(live[fault["name"]], 0) > 0:
                    fault["recovered_s"] = now - fault["at"]
            elif fault["kind"] in ("coordinator", "redis"):
                try:
                    updated = self.store.status().updated_at or 0.0
                except Exception:  # Redis down: not yet
                    continue
                if updated > fault["wall"]:
                    fault["recovered_s"] = now - fault["at"]

    def kill(self, kind: str, name: str) -> None:
        pid = children(self.up).get(name)
        if pid is None:
            return
        os.kill(pid, signal.SIGKILL)
        self.faults.append(
            {
                "kind": kind,
                "name": name,
                "pid": pid,
                "at": time.monotonic(),
                "wall": time.time(),
                "world": self.learner_pid,
            }
        )
        print(f"  {time.monotonic() - (self.first_update_at or 0):6.1f} s  killed {name} (pid {pid})", flush=True)


def pbt_repeats(log: str) -> tuple[int, int]:
    """(learner worlds, decision ids some world applied twice) from learner-0's log."""
    worlds, repeats = 0, 0
    applied: set[int] = set()
    for line in log.splitlines():
        if re.search(r"rank 0/\d+ up on", line):
            worlds, applied = worlds + 1, set()
        elif m := re.search(r"applied PBT decision (\d+)", line):
            repeats += int(m.group(1)) in applied
            applied.add(int(m.group(1)))
    return worlds, repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=float, default=120.0)
    parser.add_argument("--actor-every", type=float, default=10.0)
    parser.add_argument("--learner-at", type=float, default=15.0)
    parser.add_argument("--coordinator-at", type=float, default=30.0)
    parser.add_argument("--redis-at", type=float, default=45.0)
    parser.add_argument("--env", default="Acrobot-v1")
    parser.add_argument("--algo", default="ppo")
    parser.add_argument("--population", type=int, default=4)
    parser.add_argument("--target", type=float, default=-100.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-every", type=float, default=10.0)
    parser.add_argument("--max-wall", type=float, default=900.0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    run_dir = Path(tempfile.mkdtemp(prefix="rlmq-chaos-")) / "run"
    command = [
        "rlmq",
        "up",
        "--actors",
        "4",
        "--learners",
        "2",
        "--env",
        args.env,
        "--algo",
        args.algo,
        "--population",
        str(args.population),
        "--seed",
        str(args.seed),
        "--target-return",
        str(args.target),
        "--total-steps",
        "100000000",
        "--checkpoint-every",
        str(args.checkpoint_every),
    ]
    up = subprocess.Popen(
        [sys.executable, "-m", "rlmq.cli", *command[1:], "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    started = time.monotonic()
    while not (run_dir / "run.json").exists():
        time.sleep(POLL_S)
    watch = Watch(run_dir, up)
    while watch.first_update_at is None and up.poll() is None:
        watch.poll()
        time.sleep(POLL_S)
    schedule = sorted(
        [(t, "actor") for t in range(int(args.actor_every), int(args.window), int(args.actor_every))]
        + [(args.learner_at, "learner"), (args.coordinator_at, "coordinator"), (args.redis_at, "redis")]
    )
    while up.poll() is None and time.monotonic() - started < args.max_wall:
        elapsed = time.monotonic() - (watch.first_update_at or 0)
        while schedule and schedule[0][0] <= elapsed:
            _, kind = schedule.pop(0)
            name = {"learner": "learner-1", "coordinator": "coordinator", "redis": "redis"}.get(
                kind
            ) or f"actor-{rng.randrange(4)}"
            watch.kill(kind, name)
        watch.poll()
        time.sleep(POLL_S)
    if up.poll() is None:
        up.send_signal(signal.SIGINT)
    out = up.communicate(timeout=120)[0].decode(errors="replace")
    summary = json.loads((run_dir / "summary.json").read_text())
    final = torch.load(max((run_dir / "checkpoints" / "rank0").glob("*.pt")), weights_only=True)
    worlds, repeats = pbt_repeats((run_dir / "logs" / "learner-0.log").read_text())
    actors_counted = sum(watch.actor_steps.values())
    lost = max(actors_counted - summary["env_steps"], 0.0)

    print(f"\n{' '.join(command)}: exit {up.returncode}, {summary.get('detail', '')}")
    print(f"learners' longest stall: {watch.longest_stall:.1f} s")
    for fault in watch.faults:
        recovered = fault.get("recovered_s")
        print(
            f"  {fault['kind']:<12} {fault['name']:<12} recovered in "
            + (f"{recovered:5.1f} s" if recovered is not None else "— (not seen before the run ended)")
        )
    print(
        f"env steps: Redis {summary['env_steps']:,}, the actors' own counters {actors_counted:,.0f} "
        f"({len(watch.actor_steps)} actor processes): lost {lost:,.0f} ({100 * lost / max(actors_counted, 1):.3f} %)"
    )
    print(
        f"PBT decisions: logged {summary['pbt_decisions']}, applied in the learners' final state "
        f"{final['learner']['applied']}, applied twice by one learner world {repeats} ({worlds} worlds)"
    )
    print(
        f"target reached: {bool(summary.get('success'))}; env steps {summary['env_steps']:,}; "
        f"wall {time.monotonic() - started:.0f} s; run directory {run_dir}"
    )
    if "Traceback" in out:
        print("rlmq up printed a traceback:\n" + out)


if __name__ == "__main__":
    main()
