"""Learner ranks stopped (SIGSTOP), as a hung process or a suspended host would be (issue 41).

`rlmq up --actors 2 --learners 2` on CartPole (no target, checkpoints every 5 s); once it steps:

both  every rank stopped for `--pause-s`, then resumed together: the seconds from the resume to the
      next policy version the coordinator publishes, and whether `rlmq up` restarted the world.
one   rank 1 stopped alone: the seconds from the stop to the first policy version of the world
      `rlmq up` restarts (the coordinator names the rank silent while rank 0 waits for it).

    python benchmarks/bench_pause.py --pause-s 60 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rlmq.coordinator.store import RunStore  # noqa: E402
from tests.helpers.procs import descendants, start_up, wait_until_stepping  # noqa: E402


def next_version_after(store: RunStore, version: int, timeout_s: float) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if store.status().policy_version > version:
            return time.monotonic() - start
        time.sleep(0.02)
    return None


def one_round(root: Path, scenario: str, pause_s: float) -> str:
    up = start_up(root, "--actors", "2", "--learners", "2", "--total-steps", "100000000", "--checkpoint-every", "5")
    try:
        store = wait_until_stepping(root, up)
        time.sleep(6)  # past the first checkpoint
        ranks = {
            cmd.split("--rank ")[1].split()[0]: pid for pid, cmd in descendants(up.pid).items() if " learner " in cmd
        }
        stopped = list(ranks.values()) if scenario == "both" else [ranks["1"]]
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        version = store.status().policy_version + 1  # an update under way may still publish
        if scenario == "both":
            time.sleep(pause_s)
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
        seconds = next_version_after(store, version, 120)
        took = "no new version within 120 s" if seconds is None else f"{seconds:.2f} s"
        what = (
            f"both stopped {pause_s:g} s, next version after the resume"
            if scenario == "both"
            else "rank 1 stopped, first version of the restarted world after the stop"
        )
        return f"{what}: {took}"
    finally:
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=60)
        for pid in locals().get("stopped") or []:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        restarts = [line for line in out.splitlines() if "restarting the learner world" in line]
        print(f"  world restarts: {len(restarts)}" + "".join(f"\n    {line}" for line in restarts), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pause-s", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scenarios", nargs="+", default=["both", "one"], choices=["both", "one"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-pause-") as tmp:
        for r in range(args.rounds):
            for scenario in args.scenarios:
                print(
                    f"{time.strftime('%H:%M:%S')} round {r}, {scenario}: "
                    f"{one_round(Path(tmp) / f'{scenario}-{r}', scenario, args.pause_s)}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
