"""Print a run's status, its actors' tallies and the env steps each learner rank has received (from
its /metrics) as one JSON line, every POLL_S, until stdin closes: for a test in the root network
namespace to watch a run whose Redis listens on another host's loopback (tests/test_hosts.py runs
this there).

    python watch_run.py REDIS_URL PASSWORD_FILE RUN [--received] ACTOR...     # --received: the ranks' /metrics too
"""

from __future__ import annotations

import json
import re
import select
import sys
import time
import urllib.request

import redis

from rlmq.common.addresses import endpoint_host
from rlmq.common.redis_urls import with_password
from rlmq.coordinator.store import RunStore

POLL_S = 0.1


def main(url: str, password_file: str, run: str, actors: list[str], received_too: bool) -> None:
    store = RunStore.connect(with_password(url, password_file), run, timeout_s=1.0)
    while not select.select([sys.stdin], [], [], POLL_S)[0]:
        try:
            status = store.status()
            tallies = {name: store.tally(name) for name in actors}
            learners = store.learners()
        except redis.RedisError:  # not up yet
            continue
        received = (
            {
                rank: received_steps(endpoint_host(record.endpoint), record.metrics_port)
                for rank, record in learners.items()
            }
            if received_too
            else {}
        )
        print(
            json.dumps(
                {
                    "time": time.time(),
                    "state": status.state,
                    "reason": status.reason,
                    "env_steps": status.env_steps,
                    "episodes": status.episodes,
                    "first_step_at": status.first_step_at,
                    "ended_at": status.ended_at,
                    "tallies": tallies,
                    "received": received,
                }
            ),
            flush=True,
        )


def received_steps(host: str, port: int) -> float | None:
    """`rlmq_learner_received_steps_total` at a learner's /metrics (None: not answering)."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=POLL_S) as answer:
            text = answer.read().decode()
    except OSError:
        return None
    found = re.search(r"^rlmq_learner_received_steps_total (\S+)$", text, re.M)
    return float(found.group(1)) if found else None


if __name__ == "__main__":
    rest = sys.argv[4:]
    main(sys.argv[1], sys.argv[2], sys.argv[3], [a for a in rest if a != "--received"], "--received" in rest)
