"""Print a run's status and its actors' tallies as one JSON line, every POLL_S, until stdin closes:
for a test in the root network namespace to watch a run whose Redis listens on another host's
loopback (tests/test_hosts.py runs this there).

    python watch_run.py REDIS_URL PASSWORD_FILE RUN ACTOR...
"""

from __future__ import annotations

import json
import select
import sys
import time

import redis

from rlmq.common.redis_urls import with_password
from rlmq.coordinator.store import RunStore

POLL_S = 0.1


def main(url: str, password_file: str, run: str, actors: list[str]) -> None:
    store = RunStore.connect(with_password(url, password_file), run, timeout_s=1.0)
    while not select.select([sys.stdin], [], [], POLL_S)[0]:
        try:
            status = store.status()
            tallies = {name: store.tally(name) for name in actors}
        except redis.RedisError:  # not up yet
            continue
        print(json.dumps({"time": time.time(), "state": status.state, "reason": status.reason,
                          "env_steps": status.env_steps, "episodes": status.episodes,
                          "first_step_at": status.first_step_at, "ended_at": status.ended_at, "tallies": tallies}),
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
